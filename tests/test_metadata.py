"""Metadata model and loader: bad input gets a precise error naming file, key path and reason,
and `metadata apply` is all-or-nothing."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import pytest
import sqlalchemy as sa

from lakehouse.cli import main as cli
from lakehouse.metadata.loader import MetadataError, load_metadata
from lakehouse.metadata.store import MetadataStore

DEMO = Path(__file__).resolve().parent.parent / "metadata" / "demo"

BASE = """
pipelines:
  - {pipeline_id: p1}
sources:
  - {source_id: raw, kind: files, format: jsonl, path: raw}
targets:
  - {target_id: b, namespace: bronze, table: t}
  - {target_id: s, namespace: silver, table: t}
stages:
  - {pipeline_id: p1, stage_order: 1, stage_name: ingest, layer: bronze, source_id: raw, target_id: b}
  - {pipeline_id: p1, stage_order: 2, stage_name: clean, layer: silver, target_id: s,
     transformation: "SELECT * FROM bronze.t"}
"""


def write(tmp_path: Path, text: str, name: str = "m.yaml") -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def problems_of(path: Path) -> list[str]:
    with pytest.raises(MetadataError) as exc:
        load_metadata(path)
    return exc.value.problems


def test_demo_metadata_is_valid():
    cat = load_metadata(DEMO).catalog
    assert [s.stage_name for s in cat.stages_of("user_events_etl")] == ["bronze_ingest", "silver_clean", "gold_aggregate"]
    assert "FROM bronze.user_events" in cat.stage("user_events_etl", "silver_clean").transformation


def test_unknown_source_id(tmp_path):
    p = write(tmp_path, BASE.replace("source_id: raw, target_id: b", "source_id: nope, target_id: b"))
    (msg,) = problems_of(p)
    assert msg.startswith(f"{p}: stages[0].source_id: unknown source 'nope'")


def test_cycle_in_stages(tmp_path):
    # silver reads bronze.t and bronze.t2; t2 is produced from silver: s -> b2 -> s
    text = BASE.replace("  - {target_id: s, namespace: silver, table: t}",
                        "  - {target_id: s, namespace: silver, table: t}\n  - {target_id: b2, namespace: bronze, table: t2}")
    text = text.replace("SELECT * FROM bronze.t", "SELECT * FROM bronze.t JOIN bronze.t2 USING (id)")
    text += "  - {pipeline_id: p1, stage_order: 3, stage_name: loop, layer: bronze, source_id: s, target_id: b2}\n"
    probs = problems_of(write(tmp_path, text))
    assert any("cycle in dataflow" in m and "s -> b2" in m for m in probs), probs


def test_duplicate_key_across_files(tmp_path):
    write(tmp_path, BASE, "a.yaml")
    b = write(tmp_path, "pipelines:\n  - {pipeline_id: p1, description: again}\n", "b.yaml")
    (msg,) = problems_of(tmp_path)
    assert msg.startswith(f"{b}: pipelines[0]: duplicate key ('p1',) in pipelines, first defined at {tmp_path / 'a.yaml'}")


def test_two_stages_on_one_asset_key(tmp_path):
    """The asset key is layer/table: two namespaces' `orders` in one layer would not load in Dagster."""
    text = BASE.replace("  - {target_id: s, namespace: silver, table: t}",
                        "  - {target_id: s, namespace: silver, table: t}\n  - {target_id: s2, namespace: crm, table: T}")
    text += "  - {pipeline_id: p1, stage_order: 3, stage_name: crm, layer: silver, target_id: s2,\n" \
            "     transformation: \"SELECT * FROM bronze.t\"}\n"
    p = write(tmp_path, text)
    (msg,) = problems_of(p)
    assert msg == (f"{p}: stages[2].target_id: asset key silver/T is also stage p1.clean (target 's'); the asset "
                   "key is layer/table, so rename one table or put it in another layer")


def test_duplicate_yaml_mapping_key(tmp_path):
    p = write(tmp_path, "pipelines:\n  - pipeline_id: p1\n    pipeline_id: p2\n")
    (msg,) = problems_of(p)
    assert "duplicate key 'pipeline_id'" in msg and "line 3" in msg


def test_wrong_type(tmp_path):
    p = write(tmp_path, BASE.replace("stage_order: 2,", "stage_order: two,"))
    (msg,) = problems_of(p)
    assert msg.startswith(f"{p}: stages[1].stage_order:") and "integer" in msg


def test_missing_required_field(tmp_path):
    p = write(tmp_path, BASE.replace("{target_id: b, namespace: bronze, table: t}", "{target_id: b, namespace: bronze}"))
    (msg,) = problems_of(p)
    assert msg.startswith(f"{p}: targets[0]:") and "namespace and table" in msg


def test_unknown_field_and_section(tmp_path):
    p = write(tmp_path, BASE.replace("{pipeline_id: p1}", "{pipeline_id: p1, enabeld: false}") + "pipelnes: []\n")
    probs = problems_of(p)
    assert any(m.startswith(f"{p}: pipelines[0].enabeld: Extra inputs are not permitted") for m in probs), probs
    assert any(m.startswith(f"{p}: pipelnes: unknown section") for m in probs), probs


def test_hostile_identifiers_rejected(tmp_path):
    p = write(tmp_path, BASE.replace("table: t}\n  - {target_id: s", "table: \"t; DROP TABLE x\"}\n  - {target_id: s"))
    (msg,) = problems_of(p)
    assert "targets[0]" in msg and "not a valid identifier" in msg


def test_unparseable_sql_names_position(tmp_path):
    p = write(tmp_path, BASE.replace("SELECT * FROM bronze.t", "SELECT * FROM (bronze.t"))
    (msg,) = problems_of(p)
    assert msg.startswith(f"{p}: stages[1].transformation: cannot parse SQL at line 1")


def test_sql_reading_unknown_table(tmp_path):
    p = write(tmp_path, BASE.replace("SELECT * FROM bronze.t", "SELECT * FROM bronze.missing"))
    (msg,) = problems_of(p)
    assert "'bronze.missing' is not the target of any stage" in msg


def test_malformed_yaml_reports_file_and_line(tmp_path):
    p = write(tmp_path, "pipelines:\n  - {pipeline_id: p1\n")
    (msg,) = problems_of(p)
    assert msg.startswith(f"{p}: YAML error") and "line" in msg


def test_apply_is_all_or_nothing(tmp_path):
    store = MetadataStore(f"sqlite:///{tmp_path / 'control.db'}")
    d = tmp_path / "meta"
    d.mkdir()
    write(d, BASE, "good.yaml")
    write(d, "sources:\n  - {source_id: other, kind: files, format: xml, path: x}\n", "bad.yaml")
    with pytest.raises(MetadataError) as exc:
        store.apply(load_metadata(d))
    assert any("bad.yaml: sources[0].format" in m for m in exc.value.problems)
    assert store.load().pipelines == []

    (d / "bad.yaml").unlink()
    store.apply(load_metadata(d))
    assert [p.pipeline_id for p in store.load().pipelines] == ["p1"]


def test_apply_merges_by_key_and_validates_the_merged_result(tmp_path):
    store = MetadataStore(f"sqlite:///{tmp_path / 'control.db'}")
    store.apply(load_metadata(write(tmp_path, BASE)))
    # A later file may refer to rows applied earlier...
    extra = write(tmp_path, """
targets:
  - {target_id: g, namespace: gold, table: t}
stages:
  - {pipeline_id: p1, stage_order: 3, stage_name: agg, layer: gold, target_id: g, transformation: "SELECT count(*) AS n FROM silver.t"}
""", "extra.yaml")
    with pytest.raises(MetadataError):  # alone, the file refers to unknown rows
        load_metadata(extra)
    store.apply(load_metadata(extra, check_refs=False))
    assert [s.stage_name for s in store.load().stages_of("p1")] == ["ingest", "clean", "agg"]
    # ...but a file whose merged result is invalid is still rejected, naming the file.
    bad = write(tmp_path, "stages:\n  - {pipeline_id: p1, stage_order: 4, stage_name: x, layer: gold, target_id: nope,"
                          " transformation: 'SELECT 1 AS one FROM gold.t'}\n", "bad.yaml")
    with pytest.raises(MetadataError) as exc:
        store.apply(load_metadata(bad, check_refs=False))
    assert exc.value.problems[0].startswith(f"{bad}: stages[0].target_id: unknown target 'nope'")
    # ...and an update replaces the row with the same key.
    store.apply(load_metadata(write(tmp_path, BASE.replace("{pipeline_id: p1}", "{pipeline_id: p1, description: new}"))))
    assert store.load().pipeline("p1").description == "new"


def test_plain_sql_update_of_control_flag_applies(tmp_path):
    store = MetadataStore(f"sqlite:///{tmp_path / 'control.db'}")
    store.apply(load_metadata(write(tmp_path, BASE)))
    assert store.enabled("p1", "clean") == (True, "enabled")
    with store.engine.begin() as conn:
        conn.execute(sa.text("UPDATE pipelines SET enabled = false WHERE pipeline_id = 'p1'"))
    ok, reason = store.enabled("p1")
    assert not ok and "disabled" in reason
    with store.engine.begin() as conn:
        conn.execute(sa.text("UPDATE pipelines SET enabled = true WHERE pipeline_id = 'p1'"))
    store.set_enabled("stage", "p1.clean", False)
    assert store.enabled("p1", "ingest")[0] and not store.enabled("p1", "clean")[0]


def test_cli_validate_apply_show(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LAKEHOUSE_HOME", str(tmp_path))
    monkeypatch.delenv("LAKEHOUSE_CONTROL_DB_URL", raising=False)
    meta = tmp_path / "meta"
    shutil.copytree(DEMO, meta)
    assert cli(["metadata", "validate", str(meta)]) == 0
    assert "valid (1 pipelines" in capsys.readouterr().out
    assert cli(["metadata", "apply", str(meta)]) == 0
    assert cli(["metadata", "show", "pipelines"]) == 0
    assert "user_events_etl" in capsys.readouterr().out
    (meta / "broken.yaml").write_text("stages:\n  - {pipeline_id: nope, stage_order: 1}\n")
    assert cli(["metadata", "apply", str(meta)]) == 2
    err = capsys.readouterr().err
    assert f"{meta / 'broken.yaml'}: stages[0].stage_name: Field required" in err
    assert cli(["pipeline", "disable", "no_such_pipeline"]) == 2
    assert "unknown pipeline 'no_such_pipeline'" in capsys.readouterr().err


def test_metadata_reference_doc_is_current():
    """docs/metadata-reference.md is generated from the model: regenerate it when a field changes."""
    from lakehouse.metadata.reference import render

    doc = (Path(__file__).resolve().parent.parent / "docs" / "metadata-reference.md").read_text()
    assert doc.strip() == render().strip(), "run: lakehouse metadata reference > docs/metadata-reference.md"


@pytest.mark.parametrize("engine", ["sqlite", "postgresql"])
def test_control_db_from_before_a_new_field_is_upgraded_in_place(tmp_path, engine, request):
    """A model field added by an upgrade becomes a column of an existing control DB on first use
    (the baseline migration brings a control DB from before migrations to it);
    rows already there read as the field's default, and nothing else changes."""
    if engine == "sqlite":
        url = f"sqlite:///{tmp_path / 'control.db'}"
    else:
        server = request.getfixturevalue("postgres_server")
        url = server.sqlalchemy_url(server.create_database())
    store = MetadataStore(url)
    store.apply(load_metadata(write(tmp_path, BASE)))
    with store.engine.begin() as conn:  # the database as an older release left it
        conn.execute(sa.text("ALTER TABLE sources DROP COLUMN lineage_columns"))
        conn.execute(sa.text("UPDATE sources SET batch_files = 7 WHERE source_id = 'raw'"))
        conn.execute(sa.text("DROP TABLE alembic_version"))  # that release predates migrations
    from lakehouse.metadata import migrate

    migrate.forget(store.engine)  # a new process

    src = MetadataStore(url).load().source("raw")
    assert src.lineage_columns is True and src.batch_files == 7
    assert "lineage_columns" in {c["name"] for c in sa.inspect(store.engine).get_columns("sources")}
    store.apply(load_metadata(write(tmp_path, BASE.replace("path: raw}", "path: raw, lineage_columns: false}"))))
    assert store.load().source("raw").lineage_columns is False
