"""Counts that mean what they say (issue 39, item 4): a merge of N changed keys into a larger table
reports the rows it read, inserted and updated, each equal to an independent count (PyIceberg reads
of the table before and after), and the physical rows Iceberg rewrote as their own field; its rule
counts say what they counted. Both kinds of merge: an incremental stage's (its change set) and a
target with `write_mode: merge` (a SQL stage's rows)."""

from __future__ import annotations

import json

import pytest

from lakehouse.metadata.loader import load_metadata

META = """
pipelines:
  - {pipeline_id: counts}
sources:
  - {source_id: versions_raw, kind: files, format: jsonl, path: versions, glob: "*.jsonl",
     columns: [{name: id, type: string}, {name: version, type: int}, {name: plan, type: string}]}
  - {source_id: customers_raw, kind: files, format: jsonl, path: customers, glob: "*.jsonl",
     columns: [{name: cid, type: int}, {name: name, type: string}]}
targets:
  - {target_id: bronze_versions, namespace: bronze, table: versions}
  - {target_id: silver_versions, namespace: silver, table: versions, write_mode: overwrite}
  - {target_id: bronze_customers, namespace: bronze, table: customers, write_mode: overwrite}
  - {target_id: silver_customers, namespace: silver, table: customers, write_mode: merge, merge_keys: [cid]}
stages:
  - {pipeline_id: counts, stage_order: 1, stage_name: ingest, layer: bronze, source_id: versions_raw,
     target_id: bronze_versions}
  - {pipeline_id: counts, stage_order: 2, stage_name: latest, layer: silver, target_id: silver_versions,
     validation_set_id: version_rules, transformation: "SELECT id, version, plan FROM bronze.versions",
     incremental: {mode: merge, merge_keys: [id], order_by: version}}
  - {pipeline_id: counts, stage_order: 3, stage_name: customers_in, layer: bronze, source_id: customers_raw,
     target_id: bronze_customers}
  - {pipeline_id: counts, stage_order: 4, stage_name: customers, layer: silver, target_id: silver_customers,
     validation_set_id: customer_rules, transformation: "SELECT cid, name FROM bronze.customers"}
validation_rules:
  - rule_set_id: version_rules
    rules:
      - {name: plan_present, type: not_null, columns: [plan], action: quarantine, severity: warn}
      - {name: plan_known, type: accepted_values, column: plan, values: [free, pro], severity: warn}
      - {name: id_unique, type: unique, columns: [id], severity: error}
      - {name: growth, type: row_count_change, max_change_pct: 100, severity: warn}
  - rule_set_id: customer_rules
    rules:
      - {name: name_present, type: not_null, columns: [name], severity: warn}
"""


@pytest.mark.slow
def test_a_merge_reports_what_its_logic_did_and_the_rewritten_rows_apart(platform, tmp_path):
    from pyiceberg.catalog.sql import SqlCatalog

    from lakehouse.stage.runner import StageRunner
    from lakehouse.validation.history import check_history
    from lakehouse.validation.rules import SCOPE_CHANGE_SET, SCOPE_MERGED_KEYS, SCOPE_TABLE

    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "meta.yaml").write_text(META)
    platform.store.apply(load_metadata(tmp_path / "m"))
    s = platform.settings
    cat = SqlCatalog(s.catalog_name, uri=s.catalog_uri, warehouse=s.warehouse)
    landing = s.landing_dir

    def land(folder: str, name: str, rows: list[dict]) -> None:
        (landing / folder).mkdir(parents=True, exist_ok=True)
        (landing / folder / name).write_text("".join(json.dumps(r) + "\n" for r in rows))

    def run(stage: str):
        r = StageRunner(platform, "counts", stage)
        outcome = r.load(r.extract())
        assert outcome.published, outcome
        return outcome

    def table(ident: str, key: str) -> dict:
        return {r[key]: r for r in cat.load_table(ident).scan().to_arrow().to_pylist()}

    # ---- an incremental merge: 2,000 rows first (a full recompute), then a change set of 52 rows
    land("versions", "1.jsonl", [{"id": f"k{i:04d}", "version": 1, "plan": "free"} for i in range(2000)])
    run("ingest")
    first = run("latest")
    assert (first.rows_read, first.rows_inserted, first.rows_updated, first.rows_deleted) == (2000, 2000, 0, 0)

    change = ([{"id": f"k{i:04d}", "version": 2, "plan": "pro"} for i in range(0, 1500, 50)]  # 30 updates
              + [{"id": f"n{i:03d}", "version": 1, "plan": "free"} for i in range(15)]  # 15 new keys
              + [{"id": f"k{i:04d}", "version": 0, "plan": "pro"} for i in range(1, 6)]  # 5 older: no change
              + [{"id": f"q{i}", "version": 1, "plan": None} for i in range(2)])  # 2 quarantined
    before = table("silver.versions", "id")
    land("versions", "2.jsonl", change)
    run("ingest")
    outcome = run("latest")
    after = table("silver.versions", "id")
    inserted = len(after.keys() - before.keys())
    updated = sum(1 for k in after.keys() & before.keys() if after[k] != before[k])
    assert (inserted, updated) == (15, 30)  # the independent count
    assert (outcome.rows_read, outcome.rows_inserted, outcome.rows_updated, outcome.rows_deleted,
            outcome.quarantined_rows) == (52, inserted, updated, 0, 2)
    assert outcome.rows_written == inserted + updated
    # the physical rows: what Iceberg's snapshot summary says the MERGE wrote (whole data files)
    summary = cat.load_table("silver.versions").current_snapshot().summary.additional_properties
    assert outcome.rows_rewritten == int(summary["added-records"]) > 2000
    md = outcome.metadata()
    assert {k: md[k] for k in ("rows_read", "rows_inserted", "rows_updated", "rows_deleted", "quarantined_rows",
                               "rows_written", "rows_rewritten")} == {
        "rows_read": 52, "rows_inserted": 15, "rows_updated": 30, "rows_deleted": 0, "quarantined_rows": 2,
        "rows_written": 45, "rows_rewritten": outcome.rows_rewritten}
    # the rule counts say what they counted
    checks = {c.rule.name: c for c in outcome.checks}
    assert (checks["plan_present"].scope, checks["plan_present"].total_rows, checks["plan_present"].failed_rows) \
        == (SCOPE_CHANGE_SET, 52, 2)
    # the branch's rows of the 50 merged keys: not the 2,015 rows of the table
    assert (checks["plan_known"].scope, checks["plan_known"].total_rows) == (SCOPE_MERGED_KEYS, 50)
    history = [h for h in check_history(platform.store, dataset="silver.versions") if h["rule"] == "plan_known"]
    assert history[0]["details"]["scope"] == SCOPE_MERGED_KEYS and history[0]["total_rows"] == 50
    assert checks["id_unique"].scope == f"table (the keys of the {SCOPE_MERGED_KEYS})"
    assert checks["growth"].scope == SCOPE_TABLE

    # ---- a merge target: 500 customers, then a file of 40 rows (25 changed, 15 new); bronze holds
    # the newest file only (overwrite), silver merges it
    land("customers", "1.jsonl", [{"cid": i, "name": f"c{i}"} for i in range(500)])
    run("customers_in")
    first = run("customers")
    assert (first.rows_inserted, first.rows_updated) == (500, 0)
    before = table("silver.customers", "cid")
    land("customers", "2.jsonl", [{"cid": i, "name": f"renamed{i}"} for i in range(0, 500, 20)]
         + [{"cid": 1000 + i, "name": f"new{i}"} for i in range(15)])
    run("customers_in")
    outcome = run("customers")
    after = table("silver.customers", "cid")
    inserted = len(after.keys() - before.keys())
    updated = sum(1 for k in after.keys() & before.keys() if after[k] != before[k])
    assert (inserted, updated) == (15, 25)
    assert (outcome.rows_read, outcome.rows_inserted, outcome.rows_updated) == (40, inserted, updated)
    summary = cat.load_table("silver.customers").current_snapshot().summary.additional_properties
    assert outcome.rows_rewritten == int(summary["added-records"]) > 40
    check = next(c for c in outcome.checks if c.rule.name == "name_present")
    # audited on the rows of the merged keys (not the whole table, as before a merge target was scoped)
    assert (check.scope, check.total_rows) == (SCOPE_MERGED_KEYS, 40)
