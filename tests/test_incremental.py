"""Incremental stages (lakehouse.stage.incremental): the demo pipeline run round after round equals a full
recompute computed by an independent reader (plain Python over the landed files, PyIceberg over the
tables), through late events, duplicates across rounds, a kill -9 between the silver and gold
commits and a bronze rewritten under silver; plus the metadata's static checks and the decision
rules (fast lane)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from pydantic import ValidationError

from lakehouse.metadata.loader import MetadataError, load_metadata
from lakehouse.metadata.model import Incremental
from lakehouse.stage.incremental import FULL, MERGE, NOTHING, PARTITIONS, decide

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "metadata" / "demo"
PIPE = "user_events_etl"
STAGES = ("bronze_ingest", "silver_clean", "gold_aggregate")


# --------------------------------------------------------------------------- fast lane: metadata


@pytest.mark.parametrize("block, message", [
    ({"mode": "merge"}, "incremental mode merge needs merge_keys"),
    ({"mode": "partitions"}, "incremental mode partitions needs partition_column"),
    ({"mode": "merge", "merge_keys": ["id"], "partition_column": "d"}, "belong to incremental mode partitions"),
    ({"mode": "partitions", "partition_column": "d", "order_by": "ts"}, "belong to incremental mode merge"),
    ({"mode": "merge", "merge_keys": ["a b"]}, "is not a valid identifier"),
    ({"mode": "append"}, "Input should be 'merge' or 'partitions'"),
])
def test_incremental_block_is_validated(block, message):
    with pytest.raises(ValidationError, match=message):
        Incremental.model_validate(block)


def _demo_copy(tmp_path: Path, edit) -> Path:
    d = tmp_path / "demo"
    (d / "sql").mkdir(parents=True)
    for p in DEMO.rglob("*"):
        if p.is_file():
            (d / p.relative_to(DEMO)).write_text(p.read_text())
    y = d / "user_events.yaml"
    y.write_text(edit(y.read_text()))
    return d


def test_static_checks_name_the_field_and_the_fix(tmp_path):
    meta = _demo_copy(tmp_path, lambda s: s.replace(
        "incremental: {mode: merge, merge_keys: [event_id]}",
        "incremental: {mode: merge, merge_keys: [evt_id], order_by: seen_at}").replace(
        '"CAST(event_ts AS DATE)"', '"CAST(event_ts AS"').replace(
        "    partition_spec:\n      - {column: event_date, transform: identity}\n", "").replace(
        "description: Daily totals and unique users\n    write_mode: overwrite",
        "description: Daily totals and unique users\n    write_mode: append"))
    with pytest.raises(MetadataError) as exc:
        load_metadata(meta)
    probs = [p.split(": ", 1)[1] for p in exc.value.problems]
    assert any(p.startswith("stages[1].incremental.merge_keys[0]: 'evt_id' is not a column stage "
                            "user_events_etl.silver_clean outputs (event_id,") for p in probs), probs
    assert any(p.startswith("stages[1].incremental.order_by: 'seen_at' is not a column") for p in probs), probs
    assert any(p.startswith("targets[2].write_mode: stage user_events_etl.gold_aggregate is incremental, so its "
                            "target 'gold_daily_user_events' needs write_mode overwrite") for p in probs), probs
    assert any(p.startswith("targets[2].partition_spec: stage user_events_etl.gold_aggregate recomputes partitions "
                            "of 'event_date'") and "Fix: add {column: event_date, transform: identity}" in p
               for p in probs), probs
    assert any(p.startswith("stages[2].incremental.upstream_partition: cannot parse 'CAST(event_ts AS'") for p in probs)


def test_incremental_stage_over_two_tables_names_the_one_read_incrementally(tmp_path):
    """A join of two upstreams: the metadata must say which one's changes drive the run, and name a
    table the SQL reads; then it loads."""
    meta = _demo_copy(tmp_path, lambda s: s)
    (meta / "sql" / "gold_daily_user_events.sql").write_text(
        "SELECT CAST(s.event_ts AS DATE) AS event_date, COUNT(*) AS total_events, COUNT(DISTINCT s.user_id) AS "
        "unique_users FROM silver.user_events s JOIN bronze.user_events b ON s.event_id = b.event_id "
        "GROUP BY CAST(s.event_ts AS DATE)")
    with pytest.raises(MetadataError) as exc:
        load_metadata(meta)
    assert any("stages[2].incremental: stage user_events_etl.gold_aggregate is incremental but its SQL reads "
               "silver.user_events, bronze.user_events: say which one is read incrementally" in p
               and "Fix: add `upstream: <one of them>` to `incremental`" in p for p in exc.value.problems), \
        exc.value.problems

    y = meta / "user_events.yaml"
    y.write_text(y.read_text().replace('upstream_partition: "CAST(event_ts AS DATE)"}',
                                       'upstream_partition: "CAST(event_ts AS DATE)", upstream: gold.other}'))
    with pytest.raises(MetadataError) as exc:
        load_metadata(meta)
    assert any("stages[2].incremental.upstream: stage user_events_etl.gold_aggregate reads 'gold.other' "
               "incrementally but its SQL reads silver.user_events, bronze.user_events" in p
               for p in exc.value.problems), exc.value.problems

    y.write_text(y.read_text().replace("upstream: gold.other}", "upstream: Silver.User_Events}"))
    stage = next(s for s in load_metadata(meta).catalog.stages if s.stage_name == "gold_aggregate")
    assert stage.incremental.upstream == "silver.user_events"


# --------------------------------------------------------------------------- fast lane: decisions

#: 1 <- 2 <- 3 (overwrite) <- 4 <- 5 (replace: a compaction) <- 6 <- 7 (replace) ; 9 on another line of history
GRAPH = {1: (None, "append"), 2: (1, "append"), 3: (2, "overwrite"), 4: (3, "append"), 5: (4, "replace"),
         6: (5, "append"), 7: (6, "replace"), 9: (None, "append")}


@pytest.mark.parametrize("mode, consumed, end, want, why", [
    (MERGE, 1, 2, MERGE, ""),
    (MERGE, 2, 4, FULL, "snapshot 3 is a overwrite, which merge mode cannot follow"),
    (PARTITIONS, 2, 4, PARTITIONS, ""),
    # a replace (compaction, manifest rewrite) changed no row: every mode steps over it (issue 39, item 5)
    (PARTITIONS, 2, 5, PARTITIONS, "snapshot 5 only rewrote files (compaction or manifest rewrite, operation "
                                   "replace): stepped over"),
    (MERGE, 4, 6, MERGE, "snapshot 5 only rewrote files"),
    (MERGE, 4, 7, MERGE, "snapshots 5, 7 only rewrote files"),
    (MERGE, 4, 5, NOTHING, "snapshot 5 only rewrote files (compaction or manifest rewrite, operation replace), "
                           "no row changed"),
    (MERGE, 2, 5, FULL, "snapshot 3 is a overwrite, which merge mode cannot follow"),
    (MERGE, None, 2, FULL, "no snapshot of it consumed yet"),
    (MERGE, 8, 2, FULL, "snapshot 8, consumed last, is gone (expired)"),
    (MERGE, 9, 2, FULL, "snapshot 9, consumed last, is not an ancestor of 2"),
    (MERGE, 2, 2, NOTHING, "was consumed already"),
    (MERGE, 4, 2, NOTHING, "a later snapshot (4) was consumed already"),
])
def test_decide(mode, consumed, end, want, why):
    d = decide(GRAPH, mode, "bronze.t", consumed, end)
    assert d.mode == want
    assert why in d.reason
    if want == FULL:
        assert d.describe().startswith(f"full recompute of bronze.t up to snapshot {end}: ")
    assert d.rewrites == tuple(s for s in (5, 7) if want != FULL and consumed is not None
                               and consumed < s <= end and end in GRAPH)


def test_only_rewrites():
    """An upstream read in full beside the incremental one is unchanged across compactions only."""
    from lakehouse.stage.incremental import only_rewrites

    assert only_rewrites(GRAPH, 4, 5) and only_rewrites(GRAPH, 6, 7) and only_rewrites(GRAPH, 7, 7)
    assert not only_rewrites(GRAPH, 4, 6) and not only_rewrites(GRAPH, 9, 5)


# --------------------------------------------------------------------------- fast lane: pruning predicates


def test_key_ranges_cover_every_key_and_give_a_stray_key_its_own_range():
    """A change set's keys become at most MAX_RANGES ranges: every key inside one, none overlapping,
    cut at the widest gaps, so an old id sent again does not stretch a range over the files between."""
    from lakehouse.stage.pruning import MAX_RANGES, _ranges

    new_ids = [f"e{n:010d}" for n in range(720_000, 721_000)]
    strays = ["e0000000042", "e0000350000", "e0000719000"]
    keys = sorted(strays + new_ids)
    ranges = _ranges(keys)
    assert len(ranges) <= MAX_RANGES
    assert all(a <= b for a, b in ranges) and all(b < c for (_, b), (c, _) in zip(ranges, ranges[1:], strict=False))
    assert all(any(a <= k <= b for a, b in ranges) for k in keys)
    for k in strays:
        assert (k, k) in ranges, ranges[:5]
    assert _ranges(list(range(0, 2000, 2)) + [10**6])[-1] == (10**6, 10**6)  # numbers: by their difference
    assert _ranges([1, 5, 9]) == [(1, 1), (5, 5), (9, 9)]


@pytest.mark.parametrize("expression, column, want", [
    ("CAST(event_ts AS DATE)", "event_date", "event_ts"),
    ("to_date(ts)", "d", "ts"),
    ("date(ts)", "d", "ts"),
    (None, "event_date", "event_date"),
    ("to_date(ts, 'yyyy-MM-dd')", "d", None),  # parses text: not a range of ts
    ("CAST(ts AS STRING)", "d", None),
    ("substr(ts, 1, 10)", "d", None),
])
def test_day_column_of_an_upstream_partition_expression(expression, column, want):
    from lakehouse.stage.pruning import day_column

    assert day_column(expression, column) == want


# --------------------------------------------------------------------------- the demo, round after round

EPOCH = datetime(2026, 11, 1, tzinfo=UTC)


class Feed:
    """Lands rounds of JSON-lines files and keeps the independent expectation: the latest record of
    each event_id (later round, then later file name, wins: what bronze's _ingested_at and
    _source_file order by), null ids dropped."""

    def __init__(self, landing: Path, seed: int = 19):
        self.dir = landing / "user_events"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.rng = random.Random(seed)
        self.latest: dict[str, dict] = {}
        self.round = 0
        self.n = 0

    def record(self, day: int, event_id: str | None = None) -> dict:
        self.n += 1
        ts = EPOCH + timedelta(days=day, seconds=self.rng.randrange(86400))
        return {"event_id": event_id or f"e{self.n:05d}", "user_id": self.rng.randrange(1, 6),
                "event_type": self.rng.choice(["view", "CLICK", "purchase"]), "event_ts": ts.strftime("%Y-%m-%d %H:%M:%S"),
                "country": self.rng.choice(["US", "DE", None]), "context": {"device": "ios", "app_version": "1.0"}}

    def land(self, days: list[int], *, late_day: int | None = None, redeliver: int = 0) -> None:
        """One round: two files of new events on `days`, a late event for `late_day`, `redeliver`
        earlier events sent again with other values, one event twice across this round's files,
        one record without an id."""
        self.round += 1
        first = [self.record(d) for d in days for _ in range(3)]
        if late_day is not None:
            first.append(self.record(late_day))
        old = sorted(self.latest)
        for eid in self.rng.sample(old, min(redeliver, len(old))):
            day = (datetime.strptime(self.latest[eid]["event_ts"][:10], "%Y-%m-%d").replace(tzinfo=UTC) - EPOCH).days
            first.append(self.record(day, event_id=eid))  # sent again, same day, other values
        second = [dict(first[0], country="FR"), self.record(days[-1]), {**self.record(days[0]), "event_id": None}]
        self.touched = set()
        for i, recs in enumerate((first, second)):
            path = self.dir / f"r{self.round:02d}_f{i}.jsonl"
            path.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in recs))
            for r in recs:
                if r["event_id"] is not None:
                    self.latest[r["event_id"]] = r
                    self.touched.add(r["event_ts"][:10])

    def silver(self) -> set[tuple]:
        return {(r["event_id"], r["user_id"], r["event_type"].lower(), r["event_ts"], r["country"] or "unknown",
                 r["context"]["device"]) for r in self.latest.values()}

    def gold(self) -> dict[str, tuple[int, int]]:
        days: dict[str, list] = {}
        for r in self.latest.values():
            days.setdefault(r["event_ts"][:10], []).append(r["user_id"])
        return {d: (len(u), len(set(u))) for d, u in days.items()}


def _tables(settings):
    from pyiceberg.catalog.sql import SqlCatalog

    cat = SqlCatalog(settings.catalog_name, uri=settings.catalog_uri, warehouse=settings.warehouse)
    silver = {(r["event_id"], r["user_id"], r["event_type"], r["event_ts"].strftime("%Y-%m-%d %H:%M:%S"), r["country"],
               r["device"]) for r in cat.load_table("silver.user_events").scan().to_arrow().to_pylist()}
    gold = {str(r["event_date"]): (r["total_events"], r["unique_users"])
            for r in cat.load_table("gold.daily_user_events").scan().to_arrow().to_pylist()}
    return cat, silver, gold


def run_stages(platform, stages=STAGES) -> dict:
    from lakehouse.stage.runner import StageRunner

    out = {}
    for name in stages:
        r = StageRunner(platform, PIPE, name)
        outcome = r.load(r.extract())
        assert outcome.published, (name, outcome)
        out[name] = outcome
    return out


def _mode(cat, ident: str) -> str | None:
    return cat.load_table(ident).current_snapshot().summary.additional_properties.get("lakehouse.stage.incremental")


def _apply_one(platform, tmp_path, text: str):
    """Apply `text` as the only metadata file; the independent reader of the platform's catalog."""
    from pyiceberg.catalog.sql import SqlCatalog

    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "meta.yaml").write_text(text)
    platform.store.apply(load_metadata(tmp_path / "m"))
    s = platform.settings
    return SqlCatalog(s.catalog_name, uri=s.catalog_uri, warehouse=s.warehouse)


def _last_incremental(platform, stage: str):
    return [e for e in platform.store.audit_entries(pipeline_id=PIPE, event="incremental")
            if e.stage_name == stage][-1]


@pytest.fixture
def demo(platform):
    platform.store.apply(load_metadata(DEMO))
    return platform, Feed(platform.settings.landing_dir)


RUN = """
from lakehouse.stage.runner import Platform, StageRunner
p = Platform.from_env()
for name in ("bronze_ingest", "silver_clean", "gold_aggregate"):
    r = StageRunner(p, "user_events_etl", name)
    r.load(r.extract())
"""


def run_killed_between_silver_and_gold(tmp_path) -> None:
    """A subprocess (its own JVM) runs the pipeline and is killed -9 in gold's step right before
    gold's publish: silver's commit is on main, gold's is not."""
    marker = tmp_path / "crash.marker"
    env = {**os.environ, "LAKEHOUSE_CRASH_AT": "publish@gold_aggregate", "LAKEHOUSE_CRASH_MARKER": str(marker),
           "LAKEHOUSE_SPARK_MASTER": "local[1]", "LAKEHOUSE_SHUFFLE_PARTITIONS": "1", "PYTHONUNBUFFERED": "1"}
    log = tmp_path / "killed.log"
    with log.open("w") as fh:
        proc = subprocess.Popen([sys.executable, "-c", RUN], env=env, stdout=fh, stderr=subprocess.STDOUT,
                                start_new_session=True)
    deadline = time.monotonic() + 900
    while not marker.exists():
        if proc.poll() is not None:
            raise AssertionError(f"the run ended before gold's publish: {log.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            raise AssertionError("the run never reached gold's publish")
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=60) == -signal.SIGKILL


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_rounds_equal_a_full_recompute_through_a_kill9_and_a_bronze_rewrite(demo, tmp_path):
    """Five rounds of new files (late events, redeliveries), a kill -9 before gold's publish in round 3,
    then bronze rewritten before round 6 (silver falls back to a full recompute): after every round
    silver and gold equal the independent expectation. One test, so the rounds share one history."""
    platform, feed = demo
    # late events for old days and events sent again in later rounds; redelivered ones stay on their
    # day, so every round leaves some days alone
    rounds = [dict(days=[0, 1, 2]), dict(days=[3], late_day=0), dict(days=[4], late_day=1, redeliver=1),
              dict(days=[5]), dict(days=[6], late_day=3, redeliver=2)]
    for i, spec in enumerate(rounds, 1):
        before = feed.gold()
        feed.land(**spec)
        if i == 3:
            run_killed_between_silver_and_gold(tmp_path)
            cat, silver, gold = _tables(platform.settings)
            assert silver == feed.silver()  # silver committed, gold not: gold still shows the round before
            assert gold == before
        run_stages(platform)
        cat, silver, gold = _tables(platform.settings)
        assert silver == feed.silver(), f"round {i}"
        assert gold == feed.gold(), f"round {i}"
        if i == 1:
            assert (_mode(cat, "silver.user_events"), _mode(cat, "gold.daily_user_events")) == (FULL, FULL)
            continue
        # from round 2 on: silver merged the new bronze rows, gold recomputed only the days they touched
        assert _mode(cat, "gold.daily_user_events") == PARTITIONS, f"round {i}"
        g = _last_incremental(platform, "gold_aggregate")
        assert g.outcome == "incremental"
        assert set(g.details["partitions"]) == feed.touched, (i, g.details)  # exactly the days that changed
        assert len(feed.touched) < len(feed.gold())
        if i != 3:  # in round 3 the killed run published silver: the rerun found nothing new for it
            assert _mode(cat, "silver.user_events") == MERGE, f"round {i}"
        else:
            assert _last_incremental(platform, "silver_clean").outcome == "nothing_new"
    # the consumed marks are where the data is: each table consumed its upstream's current snapshot
    silver_snap = cat.load_table("silver.user_events").current_snapshot()
    assert silver_snap.summary.additional_properties["lakehouse.consumed.bronze.user_events"] == str(
        cat.load_table("bronze.user_events").current_snapshot().snapshot_id)
    assert cat.load_table("gold.daily_user_events").current_snapshot().summary.additional_properties[
        "lakehouse.consumed.silver.user_events"] == str(silver_snap.snapshot_id)

    # round 6: bronze rewritten in place (the same rows in new files: an overwrite snapshot), then new
    # files land: silver cannot follow an overwrite and recomputes in full, saying why; still equal
    ident = "bronze.user_events"
    tables = platform.tables()
    tables.spark.table(tables.qualified(ident)).writeTo(tables.qualified(ident)).overwritePartitions()
    feed.land(days=[7], late_day=4, redeliver=2)
    run_stages(platform)
    cat, silver, gold = _tables(platform.settings)
    s = _last_incremental(platform, "silver_clean")
    assert (s.outcome, _mode(cat, "silver.user_events")) == ("fallback_full", FULL)
    assert "is a overwrite, which merge mode cannot follow" in s.message
    assert silver == feed.silver()
    assert gold == feed.gold()
    # silver's full overwrite is a change gold can follow: every day's rows were rewritten, every day recomputed
    assert _mode(cat, "gold.daily_user_events") == PARTITIONS
    assert set(_last_incremental(platform, "gold_aggregate").details["partitions"]) == set(feed.gold())


VERSIONS = """
pipelines:
  - {pipeline_id: versions}
sources:
  - {source_id: versions_raw, kind: files, format: jsonl, path: versions, glob: "*.jsonl",
     columns: [{name: id, type: string}, {name: version, type: int}, {name: value, type: string}]}
targets:
  - {target_id: bronze_versions, namespace: bronze, table: versions}
  - {target_id: silver_versions, namespace: silver, table: versions, write_mode: overwrite}
stages:
  - {pipeline_id: versions, stage_order: 1, stage_name: ingest, layer: bronze, source_id: versions_raw,
     target_id: bronze_versions}
  - {pipeline_id: versions, stage_order: 2, stage_name: latest, layer: silver, target_id: silver_versions,
     transformation: "SELECT id, version, value FROM bronze.versions",
     incremental: {mode: merge, merge_keys: [id], order_by: version}}
"""


@pytest.mark.slow
def test_merge_order_by_keeps_the_newest_version_whatever_arrives_when(platform, tmp_path):
    """order_by: duplicates of a key in one change set keep the highest version, and a version older
    than the target's, arriving later, changes nothing; the full first run dedupes the same way."""
    from lakehouse.stage.runner import StageRunner

    cat = _apply_one(platform, tmp_path, VERSIONS)
    landing = platform.settings.landing_dir / "versions"
    landing.mkdir(parents=True)

    def round_(name: str, rows: list[tuple[str, int, str]]) -> dict:
        (landing / name).write_text("".join(json.dumps({"id": i, "version": v, "value": x}) + "\n" for i, v, x in rows))
        for stage in ("ingest", "latest"):
            r = StageRunner(platform, "versions", stage)
            assert r.load(r.extract()).published
        return {r["id"]: (r["version"], r["value"]) for r in cat.load_table("silver.versions").scan().to_arrow().to_pylist()}

    assert round_("1.jsonl", [("a", 1, "x"), ("a", 3, "z"), ("b", 1, "p")]) == {"a": (3, "z"), "b": (1, "p")}
    assert _mode(cat, "silver.versions") == FULL
    got = round_("2.jsonl", [("a", 2, "late"), ("b", 2, "q"), ("c", 1, "old"), ("c", 5, "new")])
    assert got == {"a": (3, "z"), "b": (2, "q"), "c": (5, "new")}
    assert _mode(cat, "silver.versions") == MERGE


ACCOUNTS = """
pipelines:
  - {pipeline_id: accounts}
sources:
  - {source_id: accounts_raw, kind: files, format: jsonl, path: accounts, glob: "*.jsonl",
     columns: [{name: id, type: string}, {name: version, type: int}, {name: email, type: string},
               {name: plan, type: string}]}
targets:
  - {target_id: bronze_accounts, namespace: bronze, table: accounts}
  - {target_id: silver_accounts, namespace: silver, table: accounts, write_mode: overwrite}
stages:
  - {pipeline_id: accounts, stage_order: 1, stage_name: ingest, layer: bronze, source_id: accounts_raw,
     target_id: bronze_accounts}
  - {pipeline_id: accounts, stage_order: 2, stage_name: latest, layer: silver, target_id: silver_accounts,
     validation_set_id: account_rules, transformation: "SELECT id, version, email, plan FROM bronze.accounts",
     incremental: {mode: merge, merge_keys: [id], order_by: version}}
validation_rules:
  - rule_set_id: account_rules
    rules:
      - {name: plan_known, type: accepted_values, column: plan, values: [free, pro], severity: error}
      - {name: email_unique, type: unique, columns: [email], severity: error}
"""


@pytest.mark.slow
def test_merge_audit_reads_the_merged_keys_and_still_catches_what_the_whole_table_would(platform, tmp_path):
    """A merge is audited on the rows of the keys it merged (read through their pruning predicate, not
    the whole table), yet a bad value in the change set and a duplicate made against an old row both
    block the publish; a null key merges into its null row (the MERGE's pruning keeps nulls)."""
    from lakehouse.stage.core import AuditFailed
    from lakehouse.stage.runner import StageRunner

    cat = _apply_one(platform, tmp_path, ACCOUNTS)
    landing = platform.settings.landing_dir / "accounts"
    landing.mkdir(parents=True)
    expected: dict = {}

    def round_(name: str, rows: list[tuple]):
        (landing / name).write_text("".join(json.dumps(dict(zip(("id", "version", "email", "plan"), r, strict=True))) + "\n"
                                            for r in rows))
        for stage in ("ingest", "latest"):
            r = StageRunner(platform, "accounts", stage)
            outcome = r.load(r.extract())
            assert outcome.published
        return {c.rule.name: c for c in outcome.checks}

    def silver() -> dict:
        return {r["id"]: (r["version"], r["email"], r["plan"])
                for r in cat.load_table("silver.accounts").scan().to_arrow().to_pylist()}

    first = [(f"a{i:02d}", 1, f"a{i:02d}@x", "free") for i in range(30)]
    checks = round_("1.jsonl", first)
    expected.update({i: (v, e, p) for i, v, e, p in first})
    assert _mode(cat, "silver.accounts") == FULL and checks["plan_known"].total_rows == 30
    assert silver() == expected

    change = [("a03", 2, "a03@x", "pro"), ("b00", 1, "b00@x", "free"), (None, 1, "null1@x", "free")]
    checks = round_("2.jsonl", change)
    expected.update({i: (v, e, p) for i, v, e, p in change})
    assert _mode(cat, "silver.accounts") == MERGE
    assert silver() == expected
    # scoped: the rules saw the 3 merged keys' rows, not the 32 rows of the table
    assert (checks["plan_known"].passed, checks["plan_known"].total_rows) == (True, 3)
    assert checks["email_unique"].passed

    checks = round_("3.jsonl", [(None, 2, "null2@x", "pro"), ("a04", 0, "old@x", "pro")])  # a04: older, ignored
    expected[None] = (2, "null2@x", "pro")
    assert silver() == expected  # one row for the null key, its newest version
    assert checks["plan_known"].total_rows == 2

    main = cat.load_table("silver.accounts").current_snapshot().snapshot_id
    (landing / "4.jsonl").write_text(json.dumps({"id": "b01", "version": 1, "email": "a07@x", "plan": "free"}) + "\n")
    StageRunner(platform, "accounts", "ingest").load(StageRunner(platform, "accounts", "ingest").extract())
    r = StageRunner(platform, "accounts", "latest")
    with pytest.raises(AuditFailed) as exc:  # a07@x belongs to a07, merged 3 rounds ago
        r.load(r.extract())
    failed = {c.rule.name: c for c in exc.value.outcomes if not c.passed}
    assert set(failed) == {"email_unique"}, failed
    assert failed["email_unique"].failed_rows == 2 and failed["email_unique"].sample[0]["email"] == "a07@x"
    assert cat.load_table("silver.accounts").current_snapshot().snapshot_id == main

    (landing / "5.jsonl").write_text(json.dumps({"id": "a05", "version": 2, "email": "a05@x", "plan": "gold"}) + "\n")
    StageRunner(platform, "accounts", "ingest").load(StageRunner(platform, "accounts", "ingest").extract())
    r = StageRunner(platform, "accounts", "latest")
    with pytest.raises(AuditFailed) as exc:
        r.load(r.extract())
    failed = {c.rule.name: c for c in exc.value.outcomes if not c.passed}
    assert set(failed) == {"email_unique", "plan_known"}, failed
    assert failed["plan_known"].failed_rows == 1 and failed["plan_known"].total_rows == 2
    assert cat.load_table("silver.accounts").current_snapshot().snapshot_id == main
    assert silver() == expected


ORDERS = """
pipelines:
  - {pipeline_id: orders}
sources:
  - {source_id: orders_raw, kind: files, format: jsonl, path: orders, glob: "*.jsonl",
     columns: [{name: id, type: string}, {name: uid, type: int}, {name: amount, type: int}]}
  - {source_id: users_raw, kind: files, format: jsonl, path: users, glob: "*.jsonl",
     columns: [{name: uid, type: int}, {name: country, type: string}]}
targets:
  - {target_id: bronze_orders, namespace: bronze, table: orders}
  - {target_id: bronze_users, namespace: bronze, table: users, write_mode: overwrite}
  - {target_id: silver_orders, namespace: silver, table: orders, write_mode: overwrite}
stages:
  - {pipeline_id: orders, stage_order: 1, stage_name: orders_in, layer: bronze, source_id: orders_raw,
     target_id: bronze_orders}
  - {pipeline_id: orders, stage_order: 2, stage_name: users_in, layer: bronze, source_id: users_raw,
     target_id: bronze_users}
  - pipeline_id: orders
    stage_order: 3
    stage_name: enrich
    layer: silver
    target_id: silver_orders
    transformation: >-
      SELECT o.id, o.amount, u.country FROM bronze.orders o LEFT JOIN bronze.users u ON o.uid = u.uid
    incremental: {mode: merge, merge_keys: [id], upstream: bronze.orders}
"""


@pytest.mark.slow
def test_join_to_a_dimension_reads_the_facts_incrementally_and_recomputes_when_the_dimension_changed(platform,
                                                                                                    tmp_path):
    """Orders joined to users, orders read incrementally: new orders are merged while users stay as they
    were (both snapshots recorded in the commit); once users changed, the run recomputes in full, says
    why, and old orders get the new country, which merging the new orders alone would have missed."""
    from lakehouse.stage.runner import StageRunner

    cat = _apply_one(platform, tmp_path, ORDERS)
    s = platform.settings
    for d in ("orders", "users"):
        (s.landing_dir / d).mkdir(parents=True)

    def round_(n: int, orders: list[tuple], users: dict | None = None) -> dict:
        (s.landing_dir / "orders" / f"{n}.jsonl").write_text(
            "".join(json.dumps({"id": i, "uid": u, "amount": a}) + "\n" for i, u, a in orders))
        if users is not None:  # the whole dimension, landed again: bronze.users is overwritten with it
            (s.landing_dir / "users" / f"{n}.jsonl").write_text(
                "".join(json.dumps({"uid": u, "country": c}) + "\n" for u, c in users.items()))
        for stage in ("orders_in", "users_in", "enrich"):
            r = StageRunner(platform, "orders", stage)
            r.load(r.extract())
        return {r["id"]: (r["amount"], r["country"]) for r in cat.load_table("silver.orders").scan().to_arrow().to_pylist()}

    def last(stage: str = "enrich"):
        return [e for e in platform.store.audit_entries(pipeline_id="orders", event="incremental")
                if e.stage_name == stage][-1]

    def marks() -> dict:
        props = cat.load_table("silver.orders").current_snapshot().summary.additional_properties
        return {k: int(v) for k, v in props.items() if k.startswith("lakehouse.consumed.")}

    def head(ident: str) -> int:
        return cat.load_table(ident).current_snapshot().snapshot_id

    assert round_(1, [("o1", 1, 10), ("o2", 2, 20)], {1: "US", 2: "DE"}) == {"o1": (10, "US"), "o2": (20, "DE")}
    assert _mode(cat, "silver.orders") == FULL

    got = round_(2, [("o3", 1, 30)])
    assert got == {"o1": (10, "US"), "o2": (20, "DE"), "o3": (30, "US")}
    assert _mode(cat, "silver.orders") == MERGE and last().outcome == "incremental"
    assert marks() == {"lakehouse.consumed.bronze.orders": head("bronze.orders"),
                       "lakehouse.consumed.bronze.users": head("bronze.users")}

    users_before = head("bronze.users")
    got = round_(3, [("o4", 2, 40)], {1: "FR", 2: "DE"})
    assert got == {"o1": (10, "FR"), "o2": (20, "DE"), "o3": (30, "FR"), "o4": (40, "DE")}
    e = last()
    assert (_mode(cat, "silver.orders"), e.outcome) == (FULL, "fallback_full")
    assert (f"bronze.users, read in full beside it, changed since the run before (snapshot {users_before} -> "
            f"{head('bronze.users')})") in e.message, e.message
    assert marks()["lakehouse.consumed.bronze.users"] == head("bronze.users")

    got = round_(4, [("o5", 1, 50)])  # users unchanged again: back to merging
    assert got["o5"] == (50, "FR") and len(got) == 5
    assert _mode(cat, "silver.orders") == MERGE


# --------------------------------------------------------------------------- daily partitions and backfills

CLICKS = """
pipelines:
  - {pipeline_id: clicks, owner: team:web}
sources:
  - {source_id: clicks_raw, kind: files, format: jsonl, path: clicks, glob: "*.jsonl",
     columns: [{name: ts, type: string}, {name: amount, type: int}]}
targets:
  - {target_id: bronze_clicks, namespace: bronze, table: clicks}
  - target_id: daily_clicks
    namespace: gold
    table: daily_clicks
    write_mode: overwrite
    partition_spec: [{column: day, transform: identity}]
    time_partition: {column: day, start_date: "2026-11-01", upstream: "CAST(ts AS DATE)"}
stages:
  - {pipeline_id: clicks, stage_order: 1, stage_name: ingest, layer: bronze, source_id: clicks_raw,
     target_id: bronze_clicks}
  - pipeline_id: clicks
    stage_order: 2
    stage_name: rollup
    layer: gold
    target_id: daily_clicks
    validation_set_id: clicks_rules
    transformation: >-
      SELECT CAST(ts AS DATE) AS day, count(*) AS clicks, sum(amount) AS amount
      FROM bronze.clicks GROUP BY CAST(ts AS DATE)
validation_rules:
  - rule_set_id: clicks_rules
    rules: [{name: clicks_positive, type: expression, expression: "clicks > 0", severity: error}]
"""


def test_time_partition_is_checked_statically(tmp_path):
    (tmp_path / "m.yaml").write_text(CLICKS.replace("partition_spec: [{column: day, transform: identity}]",
                                                    "partition_spec: []").replace('"CAST(ts AS DATE)"', '"CAST(ts AS"'))
    with pytest.raises(MetadataError) as exc:
        load_metadata(tmp_path)
    probs = [p.split(": ", 1)[1] for p in exc.value.problems]
    assert any(p.startswith("targets[1].partition_spec: target 'daily_clicks' has daily partitions of 'day', so target "
                            "'daily_clicks' needs the identity partition 'day'") for p in probs), probs
    assert any(p.startswith("targets[1].time_partition.upstream: cannot parse 'CAST(ts AS'") for p in probs), probs


def _clicks_pipeline(platform, tmp_path: Path, metadata: str):
    """The clicks pipeline applied; returns land(file name, [(ts, amount)]) and run(stage name)."""
    from lakehouse.stage.runner import StageRunner

    landing = platform.settings.landing_dir / "clicks"
    landing.mkdir(parents=True)
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "clicks.yaml").write_text(metadata)
    platform.store.apply(load_metadata(tmp_path / "m"))

    def land(name: str, clicks: list[tuple[str, int]]) -> None:
        (landing / name).write_text("".join(json.dumps({"ts": t, "amount": a}) + "\n" for t, a in clicks))

    def run(stage: str) -> None:
        r = StageRunner(platform, "clicks", stage)
        assert r.load(r.extract()).published

    return land, run


def _clicks(cat) -> dict[str, tuple[int, int]]:
    return {str(r["day"]): (r["clicks"], r["amount"]) for r in cat.load_table("gold.daily_clicks").scan().to_arrow().to_pylist()}


@pytest.mark.slow
def test_backfill_of_three_days_from_the_cli_rewrites_exactly_those(platform, tmp_path, capsys):
    import dagster as dg
    from pyiceberg.catalog.sql import SqlCatalog

    from lakehouse.cli import main as cli
    from lakehouse.validation.history import check_history
    from lakehouse_assets.definitions import build_definitions

    land, run = _clicks_pipeline(platform, tmp_path, CLICKS)
    land("a.jsonl", [(f"2026-11-0{d} 0{h}:00:00", 1) for d in range(1, 7) for h in (1, 2)])  # 2 clicks a day

    # the asset is daily-partitioned, a backfill of a range is one run
    key = dg.AssetKey(["gold", "daily_clicks"])
    defs = build_definitions(platform)
    asset = defs.get_assets_def(key)
    assert isinstance(asset.partitions_def, dg.DailyPartitionsDefinition)
    assert asset.partitions_def.start.date().isoformat() == "2026-11-01"
    assert asset.backfill_policy == dg.BackfillPolicy.single_run()

    run("ingest")
    run("rollup")  # an unpartitioned run computes every day
    s = platform.settings
    cat = SqlCatalog(s.catalog_name, uri=s.catalog_uri, warehouse=s.warehouse)
    before = _clicks(cat)
    assert before == {f"2026-11-0{d}": (2, 2) for d in range(1, 7)}

    # late clicks for 11-02..11-05 land upstream; the backfill of 11-02..11-04 rewrites those three days only
    land("b.jsonl", [(f"2026-11-0{d} 05:00:00", 10) for d in (2, 3, 4, 5)])
    run("ingest")
    assert cli(["backfill", "clicks", "--from", "2026-11-02", "--to", "2026-11-04"]) == 0
    assert "2026-11-02..2026-11-04" in capsys.readouterr().out
    after = _clicks(cat)
    assert after == {**before, "2026-11-02": (3, 12), "2026-11-03": (3, 12), "2026-11-04": (3, 12)}  # 11-05 untouched
    props = cat.load_table("gold.daily_clicks").current_snapshot().summary.additional_properties
    assert (props["lakehouse.stage.incremental"], props["lakehouse.partition_window"]) == ("window", "2026-11-02..2026-11-04")
    assert props["changed-partition-count"] == "3"
    # through write-audit-publish: the rule ran on the run's audit branch, which the publish removed
    run_id = props["lakehouse.run_id"]
    assert [(h["rule"], h["passed"]) for h in check_history(platform.store, "gold.daily_clicks")
            if h["run_id"] == run_id] == [("clicks_positive", True)]
    assert [e.event for e in platform.store.audit_entries(run_id=run_id) if e.event in ("partition_window", "published")] \
        == ["partition_window", "published"]
    assert not [r for r in cat.load_table("gold.daily_clicks").metadata.refs if r.startswith("audit_")]

    # the UI's way: a run of the partitioned asset for one day (11-05) rewrites that day
    job = defs.resolve_implicit_global_asset_job_def()
    res = job.execute_in_process(partition_key="2026-11-05", asset_selection=[key], raise_on_error=False,
                                 instance=dg.DagsterInstance.ephemeral())
    assert res.success
    assert _clicks(cat) == {**after, "2026-11-05": (3, 12)}
    props = cat.load_table("gold.daily_clicks").current_snapshot().summary.additional_properties
    assert (props["lakehouse.partition_window"], props["changed-partition-count"]) == ("2026-11-05..2026-11-05", "1")

    # a range before the first partition is refused before anything runs
    assert cli(["backfill", "clicks", "--from", "2026-10-30", "--to", "2026-11-01"]) == 2
    assert "before the first partition of gold.daily_clicks, 2026-11-01" in capsys.readouterr().out


HOURLY = CLICKS.replace("target_id: daily_clicks", "target_id: hourly_clicks").replace(
    "table: daily_clicks", "table: hourly_clicks").replace(
    "partition_spec: [{column: day, transform: identity}]", "partition_spec: [{column: hour, transform: identity}]").replace(
    '''time_partition: {column: day, start_date: "2026-11-01", upstream: "CAST(ts AS DATE)"}''',
    '''time_partition: {column: hour, granularity: hour, start_date: "2026-11-01",
                     upstream: "date_trunc('HOUR', CAST(ts AS TIMESTAMP))"}''').replace(
    "target_id: daily_clicks", "target_id: hourly_clicks").replace(
    "SELECT CAST(ts AS DATE) AS day, count(*) AS clicks, sum(amount) AS amount\n      FROM bronze.clicks GROUP BY CAST(ts AS DATE)",
    "SELECT date_trunc('HOUR', CAST(ts AS TIMESTAMP)) AS hour, count(*) AS clicks, sum(amount) AS amount\n"
    "      FROM bronze.clicks GROUP BY date_trunc('HOUR', CAST(ts AS TIMESTAMP))")


def test_time_partitions_by_hour_and_month(tmp_path, settings, capsys):
    """granularity hour | month: Dagster's Hourly / Monthly partitions (UTC), the periods a run's partition
    tags name (Dagster keys), a month that must start on the 1st, and CLI ranges in the target's form."""
    from types import SimpleNamespace

    import dagster as dg

    from lakehouse.cli import main as cli
    from lakehouse.errors import ConfigurationError
    from lakehouse.metadata.model import Target
    from lakehouse.metadata.store import MetadataStore
    from lakehouse.stage.incremental import RANGE_END_TAG, RANGE_START_TAG, partition_window
    from lakehouse_assets.factory import time_partitions

    assert "date_trunc('HOUR'" in HOURLY and "granularity: hour" in HOURLY and "daily_clicks" not in HOURLY

    def target(granularity: str, column: str, start: str = "2026-11-01") -> Target:
        return Target(target_id=f"t_{granularity}", namespace="gold", table=f"t_{granularity}",
                      partition_spec=[{"column": column, "transform": "identity"}],
                      time_partition={"column": column, "granularity": granularity, "start_date": start})

    hourly, monthly = target("hour", "hour"), target("month", "month", "2026-09-01")
    assert target("day", "day").time_partition.granularity == "day"  # the default stays daily
    pd = time_partitions(hourly)["partitions_def"]
    assert isinstance(pd, dg.HourlyPartitionsDefinition) and pd.get_first_partition_key() == "2026-11-01-00:00"
    pd = time_partitions(monthly)["partitions_def"]
    # a month is a partition once it has ended (as a day or an hour)
    assert isinstance(pd, dg.MonthlyPartitionsDefinition) and pd.get_first_partition_key() == "2026-09-01"

    def window(t: Target, first: str, last: str):
        return partition_window(SimpleNamespace(target=t, run_tags={RANGE_START_TAG: first, RANGE_END_TAG: last}))

    start, end = window(hourly, "2026-11-02-05:00", "2026-11-02-07:00")  # the keys a UI backfill's run carries
    assert (start.isoformat(), end.isoformat()) == ("2026-11-02T05:00:00+00:00", "2026-11-02T07:00:00+00:00")
    assert [str(p) for p in window(monthly, "2026-11-01", "2027-01-01")] == ["2026-11-01", "2027-01-01"]
    with pytest.raises(ConfigurationError, match=r"cannot rewrite hours 2026-10-31-23:00..2026-11-01-01:00: .* "
                                                 r"first partition, 2026-11-01-00:00"):
        window(hourly, "2026-10-31-23:00", "2026-11-01-01:00")
    with pytest.raises(ConfigurationError, match="'2026-11-15' is not the first day of a month"):
        window(monthly, "2026-11-15", "2026-12-01")

    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "clicks.yaml").write_text(HOURLY.replace('granularity: hour, start_date: "2026-11-01"',
                                                               'granularity: month, start_date: "2026-11-15"'))
    with pytest.raises(MetadataError) as exc:
        load_metadata(tmp_path / "m")
    assert any(p.endswith("targets[1].time_partition: Value error, monthly partitions start on the first day of a "
                          'month, not 2026-11-15. Fix: start_date: "2026-11-01"') for p in exc.value.problems), \
        exc.value.problems

    # hourly partitions hold the hour's start: a stage giving a DATE is refused before a run
    (tmp_path / "m" / "clicks.yaml").write_text(HOURLY.replace("SELECT date_trunc('HOUR', CAST(ts AS TIMESTAMP)) AS hour",
                                                               "SELECT CAST(ts AS DATE) AS hour"))
    with pytest.raises(MetadataError) as exc:
        load_metadata(tmp_path / "m")
    assert any(p.endswith("targets[1].time_partition.column: stage clicks.rollup outputs 'hour' as date, but hourly "
                          "partitions hold a TIMESTAMP (the hour's start). Fix: output it as a TIMESTAMP, e.g. "
                          "date_trunc('HOUR', ts)") for p in exc.value.problems), exc.value.problems

    # the CLI takes the range in the target's form and refuses another before anything runs
    (tmp_path / "m" / "clicks.yaml").write_text(HOURLY)
    MetadataStore(settings.control_db_url).apply(load_metadata(tmp_path / "m"))
    assert cli(["backfill", "clicks", "--from", "2026-11-02", "--to", "2026-11-02"]) == 2
    assert ("gold.hourly_clicks has hourly partitions: --from/--to '2026-11-02' is not an hour "
            "(e.g. 2026-11-02T05 or 2026-11-02-05:00)") in capsys.readouterr().out
    assert cli(["backfill", "clicks", "--from", "2026-10-31T23", "--to", "2026-11-01T01"]) == 2
    assert "before the first partition of gold.hourly_clicks, 2026-11-01-00:00" in capsys.readouterr().out


@pytest.mark.slow
def test_backfill_of_three_hours_from_the_cli_rewrites_exactly_those(platform, tmp_path, capsys):
    """An hourly-partitioned target: `lakehouse backfill --from 2026-11-01T02 --to 2026-11-01T04`
    rewrites those three hours with write-audit-publish, read back by PyIceberg; the UI's way (a run
    for the Dagster key 2026-11-01-05:00) rewrites that hour."""
    import dagster as dg
    from pyiceberg.catalog.sql import SqlCatalog

    from lakehouse.cli import main as cli
    from lakehouse_assets.definitions import build_definitions

    land, run = _clicks_pipeline(platform, tmp_path, HOURLY)
    land("a.jsonl", [(f"2026-11-01 0{h}:{m}:00", 1) for h in range(1, 7) for m in (10, 40)])  # 2 clicks an hour
    key = dg.AssetKey(["gold", "hourly_clicks"])
    defs = build_definitions(platform)
    assert isinstance(defs.get_assets_def(key).partitions_def, dg.HourlyPartitionsDefinition)

    s = platform.settings
    cat = SqlCatalog(s.catalog_name, uri=s.catalog_uri, warehouse=s.warehouse)

    def hourly() -> dict[str, tuple[int, int]]:  # an independent reader: PyIceberg, keys as UTC hours
        rows = cat.load_table("gold.hourly_clicks").scan().to_arrow().to_pylist()
        return {r["hour"].astimezone(UTC).strftime("%H:%M"): (r["clicks"], r["amount"]) for r in rows}

    run("ingest")
    run("rollup")  # an unpartitioned run computes every hour
    before = hourly()
    assert before == {f"0{h}:00": (2, 2) for h in range(1, 7)}

    # late clicks for hours 02..05; the backfill of 02..04 rewrites those three hours only
    land("b.jsonl", [(f"2026-11-01 0{h}:55:00", 10) for h in (2, 3, 4, 5)])
    run("ingest")
    assert cli(["backfill", "clicks", "--from", "2026-11-01T02", "--to", "2026-11-01T04"]) == 0
    assert "2026-11-01-02:00..2026-11-01-04:00" in capsys.readouterr().out
    after = hourly()
    assert after == {**before, "02:00": (3, 12), "03:00": (3, 12), "04:00": (3, 12)}  # 05:00 untouched
    props = cat.load_table("gold.hourly_clicks").current_snapshot().summary.additional_properties
    assert props["lakehouse.partition_window"] == "2026-11-01-02:00..2026-11-01-04:00"
    assert props["changed-partition-count"] == "3"
    [entry] = [e for e in platform.store.audit_entries(run_id=props["lakehouse.run_id"]) if e.event == "partition_window"]
    assert entry.details["granularity"] == "hour" and entry.message.startswith("hours 2026-11-01-02:00..")

    # the UI's way: a run of the partitioned asset for one hour (its Dagster key) rewrites that hour
    job = defs.resolve_implicit_global_asset_job_def()
    res = job.execute_in_process(partition_key="2026-11-01-05:00", asset_selection=[key], raise_on_error=False,
                                 instance=dg.DagsterInstance.ephemeral())
    assert res.success
    assert hourly() == {**after, "05:00": (3, 12)}
