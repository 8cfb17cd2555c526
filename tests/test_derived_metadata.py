"""Derived once, at apply (issue 22): what the definitions need from each stage's SQL and rules is
stored by `metadata apply` and only read when the definitions are built.

Fast (no Spark, no server): SQLite control DBs under tmp_path.
* the lineage read back from the control DB is what the SQL gives (a property test over queries
  generated on the demo's tables, plus the demo and the SQL-import fixture);
* editing one SQL file re-derives only that stage's row; a rule change only the stages using it;
* building the definitions parses no SQL, writes nothing, connects nowhere — and a stage changed
  behind apply's back is derived in memory (said in a warning) until `metadata derive` stores it;
* a run's build (one pipeline) gives the same job the whole code location shows.
"""

from __future__ import annotations

import json
import shutil
import socket
import sqlite3
from pathlib import Path

import dagster as dg
import pytest
import sqlalchemy as sa
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lakehouse.lineage.columns import column_lineage
from lakehouse.lineage.graph import stage_column_lineage
from lakehouse.lineage.sql_import import import_sql
from lakehouse.metadata.derived import derive_now, read_structure
from lakehouse.metadata.loader import load_metadata
from lakehouse.metadata.store import MetadataStore, derived_stages
from lakehouse.settings import load_settings
from lakehouse.stage.runner import Platform
from tests.conftest import seed_control_db

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "metadata" / "demo"
SEED_SQL = ("CREATE TABLE analytics.daily_user_events AS SELECT DATE(event_ts) AS event_date, COUNT(*) AS total_events, "
            "COUNT(DISTINCT user_id) AS unique_users FROM silver_user_events "
            "WHERE event_ts >= CURRENT_DATE - INTERVAL '1 day' GROUP BY DATE(event_ts)")


@pytest.fixture
def home(tmp_path, monkeypatch, control_db_at_head) -> Path:
    """A platform home whose control DB is an embedded one at the newest revision (no Spark)."""
    seed_control_db(control_db_at_head, tmp_path)
    monkeypatch.setenv("LAKEHOUSE_HOME", str(tmp_path))
    for var in ("LAKEHOUSE_CONTROL_DB_URL", "LAKEHOUSE_CATALOG_URI", "LAKEHOUSE_WAREHOUSE", "LAKEHOUSE_CATALOG_NAME",
                "LAKEHOUSE_DEFS_TRACE"):
        monkeypatch.delenv(var, raising=False)
    return tmp_path


def store_of(home: Path) -> MetadataStore:
    return MetadataStore(f"sqlite:///{home / 'control.db'}")


def copies(out: Path, n: int) -> Path:
    """The demo pipeline copied n times (pipelines p0..p{n-1}), one SQL file per stage, shared rule sets."""
    demo = yaml.safe_load((DEMO / "user_events.yaml").read_text())
    (out / "sql").mkdir(parents=True, exist_ok=True)
    doc: dict = {"pipelines": [], "sources": [], "targets": [], "stages": [],
                 "validation_rules": demo["validation_rules"], "retry_policies": demo["retry_policies"]}
    for i in range(n):
        doc["pipelines"].append(dict(demo["pipelines"][0], pipeline_id=f"p{i}"))
        doc["sources"].append(dict(demo["sources"][0], source_id=f"raw{i}", path=f"landing{i}"))
        doc["targets"] += [dict(t, target_id=f"{t['target_id']}{i}", table=f"{t['table']}{i}") for t in demo["targets"]]
        for layer, name in (("silver", "silver_user_events"), ("gold", "gold_daily_user_events")):
            sql = (DEMO / "sql" / f"{name}.sql").read_text()
            sql = sql.replace("bronze.user_events", f"bronze.user_events{i}").replace("silver.user_events",
                                                                                      f"silver.user_events{i}")
            (out / "sql" / f"{layer}{i}.sql").write_text(sql)
        for s in demo["stages"]:
            row = dict(s, pipeline_id=f"p{i}", target_id=f"{s['target_id']}{i}")
            if "source_id" in row:
                row["source_id"] = f"raw{i}"
            if "transformation_file" in row:
                row["transformation_file"] = f"sql/{row['layer']}{i}.sql"
            row.pop("transformation", None)
            doc["stages"].append(row)
    (out / "pipelines.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return out


def derived_rows(store: MetadataStore) -> dict[tuple[str, str], dict]:
    with store.engine.connect() as conn:
        return {(r["pipeline_id"], r["stage_name"]): dict(r) for r in conn.execute(sa.select(derived_stages)).mappings()}


# ---------------------------------------------------------------------------------------- lineage property
def expected_lineage(catalog, stage) -> tuple[dict, dict]:
    """From the SQL itself: the Dagster column deps the factory used to compute on every load
    ({column: [(producer target_id, column)]}), and the dataset_lineage shape (graph.py)."""
    cl = column_lineage(stage.transformation)
    deps = {}
    for col, pairs in cl.columns.items():
        d = [(catalog.target_by_identifier(t).target_id, c) for t, c in pairs
             if catalog.target_by_identifier(t) is not None
             and catalog.stage_for_target(catalog.target_by_identifier(t).target_id) is not None]
        if d:
            deps[col] = sorted(d)
    return deps, {t: {c: sorted(v) for c, v in cols.items()} for t, cols in stage_column_lineage(catalog, stage).items()}


def assert_stored_lineage_is_the_sqls(store: MetadataStore) -> int:
    """Every SQL stage: the lineage the definitions read from the control DB equals what its SQL gives,
    as Dagster column lineage (asset keys) and as dataset_lineage (graph.py, from the stored rows)."""
    from lakehouse_assets.factory import Graph

    structure = read_structure(store)
    assert not structure.derived_here, "a stage was derived while loading: apply did not store it"
    g = Graph(structure)
    target_of = {g.key(s): s.target_id for s in structure.catalog.stages}
    checked = 0
    for stage in structure.catalog.stages:
        if not stage.transformation:
            continue
        deps, by_upstream = expected_lineage(structure.catalog, stage)
        md = g.column_lineage(stage).get("dagster/column_lineage")
        got = {c: sorted((target_of[d.asset_key], d.column_name) for d in ds)
               for c, ds in (md.deps_by_column.items() if md else [])}
        assert got == deps, (stage.stage_name, stage.transformation)
        stored = stage_column_lineage(structure.catalog, stage, structure.derived[(stage.pipeline_id, stage.stage_name)])
        assert {t: {c: sorted(v) for c, v in cols.items()} for t, cols in stored.items()} == by_upstream
        checked += 1
    return checked


BRONZE = ["event_id", "user_id", "event_type", "event_ts", "country", "device", "_source_file", "_ingested_at"]
SILVER = ["event_id", "user_id", "event_type", "event_ts", "country", "device"]


@st.composite
def queries(draw) -> str:
    """A SELECT over the demo's bronze and silver tables: plain and aliased columns, expressions of
    two columns, aggregates with GROUP BY, a join, a CTE or a subquery around it."""
    table, cols = draw(st.sampled_from([("bronze.user_events", BRONZE), ("silver.user_events", SILVER)]))
    join = draw(st.booleans())
    picks = draw(st.lists(st.sampled_from(cols), min_size=1, max_size=4, unique=True))
    items, group = [], []
    for i, c in enumerate(picks):
        kind = draw(st.sampled_from(["plain", "alias", "expr", "agg"] if not join else ["plain", "alias", "expr"]))
        ref = f"a.{c}" if join else c
        if kind == "plain":
            items.append(ref)
            group.append(ref)
        elif kind == "alias":
            items.append(f"{ref} AS c{i}")
            group.append(ref)
        elif kind == "expr":
            other = draw(st.sampled_from(SILVER if join else cols))
            oref = f"b.{other}" if join else other
            items.append(f"concat(CAST({ref} AS STRING), CAST({oref} AS STRING)) AS e{i}")
            group += [ref, oref]
        else:
            items.append(f"count(DISTINCT {ref}) AS n{i}")
    if join:
        body = (f"SELECT {', '.join(items)} FROM {table} a JOIN silver.user_events b ON a.event_id = b.event_id")
    else:
        aggregated = any(" AS n" in x for x in items)
        body = f"SELECT {', '.join(items)} FROM {table}" + (
            f" GROUP BY {', '.join(dict.fromkeys(group))}" if aggregated and group else "")
    wrap = draw(st.sampled_from(["none", "cte", "subquery"]))
    if wrap == "cte":
        return f"WITH q AS ({body}) SELECT * FROM q" if not join else body
    if wrap == "subquery" and not join:
        return f"SELECT * FROM ({body}) AS q"
    return body


def with_stages(meta: Path, sqls: list[str]) -> None:
    doc = {"targets": [{"target_id": f"gen{i}", "namespace": "gold", "table": f"gen{i}", "write_mode": "overwrite"}
                       for i in range(len(sqls))],
           "stages": [{"pipeline_id": "user_events_etl", "stage_order": 10 + i, "stage_name": f"gen{i}",
                       "layer": "gold", "target_id": f"gen{i}", "transformation": sql} for i, sql in enumerate(sqls)]}
    (meta / "generated.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sqls=st.lists(queries(), min_size=1, max_size=6))
def test_stored_lineage_equals_what_the_sql_gives(tmp_path_factory, control_db_at_head, sqls):
    home = tmp_path_factory.mktemp("prop")
    seed_control_db(control_db_at_head, home)
    meta = home / "meta"
    shutil.copytree(DEMO, meta)
    with_stages(meta, sqls)
    store = store_of(home)
    store.apply(load_metadata(meta))
    assert assert_stored_lineage_is_the_sqls(store) == 2 + len(sqls)


def test_sql_import_fixture_lineage_is_stored(home):
    from tests.test_sql_import import demo_without_gold

    meta = demo_without_gold(home)
    store = store_of(home)
    store.apply(load_metadata(meta))
    imported = import_sql(SEED_SQL, store.load(), file_name="daily.sql")
    (meta / "imported.yaml").write_text(imported.to_yaml())
    store.apply(load_metadata(meta))
    assert assert_stored_lineage_is_the_sqls(store) == 2
    row = derived_rows(store)[("user_events_etl", "daily_user_events")]
    assert json.loads(row["column_lineage"]) == {"event_date": [["silver.user_events", "event_ts"]], "total_events": [],
                                                 "unique_users": [["silver.user_events", "user_id"]]}
    # the same lineage the import wrote into dataset_lineage
    assert imported.dataset_lineage[0].column_lineage == {"event_date": ["event_ts"], "unique_users": ["user_id"]}


# ---------------------------------------------------------------------------------------- re-derive only what changed
def test_one_sql_file_edited_rederives_only_its_stage(home):
    meta = copies(home / "meta", 3)
    store = store_of(home)
    counts = store.apply(load_metadata(meta))
    assert counts["derived_stages"] == 9
    before = derived_rows(store)
    assert store.apply(load_metadata(meta))["derived_stages"] == 0  # nothing changed: nothing derived
    assert derived_rows(store) == before

    sql = meta / "sql" / "silver1.sql"
    sql.write_text(sql.read_text().replace("WHERE rn = 1", "WHERE rn = 1 AND event_type <> 'test'"))
    assert store.apply(load_metadata(meta))["derived_stages"] == 1
    after = derived_rows(store)
    changed = {k for k in before if before[k] != after[k]}
    assert changed == {("p1", "silver_clean")}
    assert before[("p1", "silver_clean")]["fingerprint"] != after[("p1", "silver_clean")]["fingerprint"]
    # same columns out: the gold stage reading it is untouched (its fingerprint covers what it reads)
    assert after[("p1", "gold_aggregate")] == before[("p1", "gold_aggregate")]

    # a new output column: the stage and the one reading its table, nothing else
    sql.write_text(sql.read_text().replace("SELECT event_id, user_id,", "SELECT event_id, user_id, 1 AS one,", 1))
    assert store.apply(load_metadata(meta))["derived_stages"] == 2
    again = derived_rows(store)
    assert {k for k in after if after[k] != again[k]} == {("p1", "silver_clean"), ("p1", "gold_aggregate")}
    assert "one" in json.loads(again[("p1", "silver_clean")]["output_columns"])["columns"]

    # a rule changed: the stages checked by that rule set (all three silver stages share it)
    doc = yaml.safe_load((meta / "pipelines.yaml").read_text())
    rs = next(r for r in doc["validation_rules"] if r["rule_set_id"] == "silver_events_rules")
    rs["rules"].append({"name": "country_known", "type": "not_null", "columns": ["country"], "severity": "warn"})
    (meta / "pipelines.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    store.apply(load_metadata(meta))
    last = derived_rows(store)
    assert {k for k in again if again[k] != last[k]} == {(f"p{i}", "silver_clean") for i in range(3)}
    assert "country_known" in [c["name"] for c in json.loads(last[("p0", "silver_clean")]["check_specs"])]

    # a stage removed from the metadata loses its derived row
    store.apply(load_metadata(copies(home / "meta2", 2)), replace=True)
    assert {k[0] for k in derived_rows(store)} == {"p0", "p1"}


# ---------------------------------------------------------------------------------------- loading the definitions
class Watch:
    """What a definitions load does: SQL parsed, statements sent to the control DB, sockets opened."""

    def __init__(self, monkeypatch, engine):
        import sqlglot.parser
        import sqlglot.tokens

        self.parsed: list[str] = []
        self.statements: list[str] = []
        self.connects: list = []
        parse, tokenize = sqlglot.parser.Parser.parse, sqlglot.tokens.Tokenizer.tokenize

        def counting_parse(parser, raw_tokens, sql=None):
            self.parsed.append(sql or "")
            return parse(parser, raw_tokens, sql)

        def counting_tokenize(tokenizer, sql):
            self.parsed.append(sql)
            return tokenize(tokenizer, sql)

        monkeypatch.setattr(sqlglot.parser.Parser, "parse", counting_parse)
        monkeypatch.setattr(sqlglot.tokens.Tokenizer, "tokenize", counting_tokenize)
        connect = socket.socket.connect

        def guarded(sock, address):
            self.connects.append(address)
            return connect(sock, address)

        monkeypatch.setattr(socket.socket, "connect", guarded)
        sa.event.listen(engine, "before_cursor_execute", self._statement)
        self._engine = engine

    def _statement(self, conn, cursor, statement, *args):
        self.statements.append(statement.strip().split()[0].upper())

    def close(self):
        sa.event.remove(self._engine, "before_cursor_execute", self._statement)


def dump(db: Path) -> list[str]:
    con = sqlite3.connect(db)
    try:
        return list(con.iterdump())
    finally:
        con.close()


def test_loading_the_definitions_parses_no_sql_and_writes_nothing(home, monkeypatch, caplog):
    from lakehouse_assets.definitions import build_definitions, lakehouse_repository

    meta = copies(home / "meta", 3)
    store = store_of(home)
    store.apply(load_metadata(meta))
    before = dump(home / "control.db")
    files_before = sorted(p.name for p in home.iterdir())
    platform = Platform(load_settings(), MetadataStore(f"sqlite:///{home / 'control.db'}"))
    watch = Watch(monkeypatch, platform.store.engine)
    try:
        defs = build_definitions(platform)
        graph = defs.resolve_asset_graph()
        repo = lakehouse_repository(platform)
        repo.load_all_definitions()  # what a code server does
        assert len(repo.job_names) == len(defs.jobs) + 1  # + the implicit asset job
    finally:
        watch.close()
    assert watch.parsed == [], f"SQL was parsed while loading: {watch.parsed[:2]}"
    assert set(watch.statements) <= {"SELECT", "PRAGMA"}, watch.statements
    assert watch.connects == []
    assert dump(home / "control.db") == before
    assert sorted(p.name for p in home.iterdir() if not p.name.startswith("control.db")) == \
        [n for n in files_before if not n.startswith("control.db")]  # no catalog, warehouse or entity_raw table
    stages = [k for k in graph.get_all_asset_keys() if k.path[0] in ("bronze", "silver", "gold")]
    assert len(stages) == 9
    assert graph.get(dg.AssetKey(["gold", "daily_user_events2"])).parent_keys == {dg.AssetKey(["silver", "user_events2"])}
    checks = {c.name for c in graph.get(dg.AssetKey(["silver", "user_events0"])).check_keys}
    assert checks == {"event_id_unique", "known_event_type", "user_id_positive"}

    # a stage changed behind apply's back (plain SQL): derived while loading, with a warning, until stored
    with store.engine.begin() as conn:
        conn.execute(sa.text("UPDATE stages SET transformation = :t WHERE pipeline_id = 'p0' AND stage_name = "
                             "'gold_aggregate'"), {"t": "SELECT event_id FROM bronze.user_events1"})
    watch = Watch(monkeypatch, platform.store.engine)
    try:
        graph = build_definitions(platform).resolve_asset_graph()
    finally:
        watch.close()
    assert watch.parsed, "the changed stage's SQL is derived in memory"
    assert "lakehouse metadata derive" in caplog.text
    assert graph.get(dg.AssetKey(["gold", "daily_user_events0"])).parent_keys == {dg.AssetKey(["bronze",
                                                                                              "user_events1"])}
    assert len(derive_now(store).rederived) == 1
    watch = Watch(monkeypatch, platform.store.engine)
    try:
        build_definitions(platform).resolve_asset_graph()
    finally:
        watch.close()
    assert watch.parsed == []


@pytest.mark.slow  # a subprocess of the platform
def test_importing_the_code_location_touches_nothing(tmp_path):
    import subprocess
    import sys

    home = tmp_path / "home"
    env = {"LAKEHOUSE_HOME": str(home), "PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.run([sys.executable, "-c", "import lakehouse_assets.definitions as d; print(type(d.defs).__name__)"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "RepositoryDefinition"  # dg.repository over a lazy dg.RepositoryData
    assert not home.exists()  # no control DB, catalog or folder created by the import


def test_a_runs_build_is_the_job_the_code_location_shows(home, monkeypatch):
    from lakehouse_assets.definitions import build_definitions, lakehouse_repository, pipeline_job
    from lakehouse_assets.factory import PIPELINES_JOB

    trace = home / "trace.jsonl"
    monkeypatch.setenv("LAKEHOUSE_DEFS_TRACE", str(trace))
    meta = copies(home / "meta", 3)
    # p2's silver stage also reads p0's bronze table: its deps cross pipelines
    sql = meta / "sql" / "silver2.sql"
    sql.write_text(sql.read_text().replace("FROM bronze.user_events2", "FROM (SELECT * FROM bronze.user_events2 UNION "
                                                                        "ALL SELECT * FROM bronze.user_events0)"))
    doc = yaml.safe_load((meta / "pipelines.yaml").read_text())  # over two tables, it cannot be incremental
    for row in doc["stages"]:
        if (row["pipeline_id"], row["layer"]) == ("p2", "silver"):
            row.pop("incremental", None)
    (meta / "pipelines.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    store_of(home).apply(load_metadata(meta))
    platform = Platform(load_settings(), store_of(home))
    whole = build_definitions(platform)
    assert not [j.name for j in whole.jobs if j.name.startswith("p")]  # no job per pipeline
    full = pipeline_job(whole, "p2")
    scoped_defs = build_definitions(platform, pipelines=["p2"])
    scoped = pipeline_job(scoped_defs, "p2")
    # a pipeline's run is Dagster's implicit asset job with its stages selected, in both builds
    assert not scoped_defs.jobs and full.name == scoped.name == PIPELINES_JOB
    stage_keys = {k for a in scoped_defs.assets if isinstance(a, dg.AssetsDefinition) for k in a.keys}
    # p0's table, read by p2's SQL, is there to be loaded as an input (through the IO manager), not built
    assert [s.key for s in scoped_defs.assets if isinstance(s, dg.AssetSpec)] == [dg.AssetKey(["bronze", "user_events0"])]
    assert stage_keys == {dg.AssetKey([layer, f"{t}2"]) for layer, t in
                          (("bronze", "user_events"), ("silver", "user_events"), ("gold", "daily_user_events"))}
    assert scoped.asset_layer.selected_asset_keys == full.asset_layer.selected_asset_keys == stage_keys
    from dagster._core.execution.api import create_execution_plan

    assert sorted(s.key for s in create_execution_plan(scoped).steps) == \
        sorted(s.key for s in create_execution_plan(full).steps)
    silver = scoped.asset_layer.asset_graph.get(dg.AssetKey(["silver", "user_events2"]))
    assert silver.parent_keys == {dg.AssetKey(["bronze", "user_events2"]), dg.AssetKey(["bronze", "user_events0"])}

    # the code location's repository answers a run of p1's stages (what a run worker asks,
    # ReconstructableJob.get_definition) from the whole graph, with the same steps
    p1 = pipeline_job(whole, "p1").asset_layer.selected_asset_keys
    trace.unlink()
    repo = lakehouse_repository(platform)
    job = repo.get_maybe_subset_job_def(PIPELINES_JOB, asset_selection=p1)
    assert job.asset_layer.selected_asset_keys == p1 and job.name == PIPELINES_JOB
    assert sorted(s.key for s in create_execution_plan(job).steps) == \
        sorted(s.key for s in create_execution_plan(pipeline_job(whole, "p1")).steps)
    repo.get_maybe_subset_job_def(PIPELINES_JOB, asset_selection={*p1, dg.AssetKey(["maintenance", "bronze"])})
    assert PIPELINES_JOB in repo.job_names
    assert [json.loads(x)["pipelines"] for x in trace.read_text().splitlines()] == [None]  # built once, whole


def test_concurrent_repository_snapshots_compute_each_job_snapshot_once(home, monkeypatch):
    """After a reload the webserver (twice) and the daemon ask the code server for the repository's
    snapshot at once; each needs every job's snapshot id. They are computed once, not once per request."""
    import threading
    import time
    from collections import Counter

    from dagster._core.remote_representation.external_data import RepositorySnap
    from dagster._core.snap import JobSnap

    from lakehouse_assets.definitions import lakehouse_repository

    store_of(home).apply(load_metadata(copies(home / "meta", 3)))
    repo = lakehouse_repository(Platform(load_settings(), store_of(home)))
    assert repo.assets_defs_by_key  # the graph is built; no job snapshot id is computed yet
    computed: Counter = Counter()
    real = JobSnap.from_job_def.__func__

    def slow_snapshot(cls, job_def, *args, **kwargs):
        computed[job_def.name] += 1
        time.sleep(0.05)  # long enough for the requests to overlap
        return real(cls, job_def, *args, **kwargs)

    monkeypatch.setattr(JobSnap, "from_job_def", classmethod(slow_snapshot))
    snaps: list = []
    requests = [threading.Thread(target=lambda: snaps.append(RepositorySnap.from_def(repo, defer_snapshots=True)))
                for _ in range(3)]
    for t in requests:
        t.start()
    for t in requests:
        t.join()
    assert len(snaps) == 3 and len({tuple(j.snapshot_id for j in s.job_refs) for s in snaps}) == 1
    assert set(computed) == set(repo.job_names) and set(computed.values()) == {1}, computed


def test_stage_assets_get_the_resources_definitions_binds(home):
    """`Definitions` binds the platform's resources to every stage asset; another binding
    (dg.materialize(assets, resources=...)) replaces them."""
    from lakehouse_assets import definitions

    store_of(home).apply(load_metadata(copies(home / "meta", 3)))
    platform = Platform(load_settings(), store_of(home))
    repo = definitions.build_definitions(platform).get_repository_def()
    stages = [a for a in repo.asset_graph.assets_defs if a.is_executable
              and any("lakehouse/pipeline" in (spec.tags or {}) for spec in a.specs)]
    assert len({k for a in stages for k in a.keys}) == 9
    assert all(set(a.resource_defs) >= {"lakehouse", "pyspark", "iceberg_io_manager"} for a in stages)
    stage = next(a for a in definitions.build_definitions(platform, pipelines=["p0"]).assets
                 if isinstance(a, dg.AssetsDefinition))
    other = {"lakehouse": dg.ResourceDefinition.hardcoded_resource(1),
             "pyspark": dg.ResourceDefinition.hardcoded_resource(2), "iceberg_io_manager": dg.mem_io_manager}
    [rebound] = dg.with_resources([stage], other)
    assert all(rebound.resource_defs[k] is r for k, r in other.items()) and rebound is not stage
