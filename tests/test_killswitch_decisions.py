"""Which active runs the kill switch stops, decided from the control DB at call time (a real
Dagster instance holding real runs of the metadata-built jobs; no daemon needed for the decision)."""

from __future__ import annotations

import dagster as dg
import sqlalchemy as sa

from lakehouse.metadata.loader import load_metadata
from lakehouse.metadata.store import MetadataStore
from lakehouse.orchestration.killswitch import enforce, runs_to_stop
from lakehouse.stage.runner import Platform

META = """
pipelines:
  - {pipeline_id: kd}
  - {pipeline_id: other}
sources:
  - {source_id: kd_raw, kind: files, format: jsonl, path: kd}
targets:
  - {target_id: kd_a, namespace: bronze, table: kd_a}
  - {target_id: kd_b, namespace: silver, table: kd_b}
  - {target_id: other_t, namespace: bronze, table: other_t}
stages:
  - {pipeline_id: kd, stage_order: 1, stage_name: a, layer: bronze, source_id: kd_raw, target_id: kd_a}
  - {pipeline_id: kd, stage_order: 2, stage_name: b, layer: silver, target_id: kd_b,
     transformation: "SELECT * FROM bronze.kd_a"}
  - {pipeline_id: other, stage_order: 1, stage_name: o, layer: bronze, source_id: kd_raw, target_id: other_t}
"""


def test_pipeline_and_stage_flags_select_the_runs_to_stop(settings, tmp_path):
    from lakehouse_assets.definitions import build_definitions, pipeline_job

    platform = Platform(settings, MetadataStore(settings.control_db_url))
    f = tmp_path / "kd.yaml"
    f.write_text(META)
    platform.store.apply(load_metadata(f))
    defs = build_definitions(platform)
    instance = dg.DagsterInstance.ephemeral()

    def new_run(pipeline: str, keys=None, tagged: bool = True):
        job_def = pipeline_job(defs, pipeline)  # the asset job with the pipeline's stages selected
        return instance.create_run_for_job(job_def, tags={"lakehouse/pipeline": pipeline} if tagged else {},
                                           asset_selection=frozenset(keys or job_def.asset_layer.selected_asset_keys)
                                           ).run_id

    whole = new_run("kd")
    only_b = new_run("kd", [dg.AssetKey(["silver", "kd_b"])])
    from_ui = new_run("kd", tagged=False)  # a UI "Materialize" of kd's assets: no tag, known by its selection
    unrelated = new_run("other")
    assert runs_to_stop(instance, platform) == []

    platform.store.set_enabled("stage", "kd.b", False, by="test")
    assert [d.run_id for d in runs_to_stop(instance, platform)] == [only_b]  # whole still has stage a

    with platform.store.engine.begin() as conn:  # plain SQL on the pipelines table
        conn.execute(sa.text("UPDATE pipelines SET enabled = :v WHERE pipeline_id = :p"), {"v": False, "p": "kd"})
    decisions = {d.run_id: d for d in runs_to_stop(instance, platform)}
    assert set(decisions) == {whole, only_b, from_ui} and unrelated not in decisions
    assert decisions[from_ui].pipeline_id == "kd"
    assert "pipeline 'kd' is disabled" in decisions[whole].reason
    assert decisions[whole].action == "cancel"  # NOT_STARTED: cancelled, never launched

    platform.store.set_enabled("platform", "*", False, by="test")
    assert {d.run_id for d in runs_to_stop(instance, platform)} == {whole, only_b, from_ui, unrelated}
    platform.store.set_enabled("platform", "*", True, by="test")

    enforce(instance, platform)
    logged = {e.run_id for e in platform.store.audit_entries(event="kill_switch")}
    assert logged == {whole, only_b, from_ui}
