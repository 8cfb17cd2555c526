"""DataHub emission with the real DatahubRestEmitter over a socket to a local GMS (tests/fixtures/
datahub_gms.py): the demo pipeline's proposals incl. column lineage; an outage during a run loses
nothing; with no GMS the proposals go to a file the `datahub` CLI checks and replays."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from lakehouse.cli.demo import generate_user_events
from lakehouse.lineage import datahub
from lakehouse.metadata.loader import load_metadata

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "metadata" / "demo"
DATAHUB_CLI = str(Path(os.sys.executable).with_name("datahub"))

GOLD = "urn:li:dataset:(urn:li:dataPlatform:iceberg,gold.daily_user_events,PROD)"
SILVER = "urn:li:dataset:(urn:li:dataPlatform:iceberg,silver.user_events,PROD)"
BRONZE = "urn:li:dataset:(urn:li:dataPlatform:iceberg,bronze.user_events,PROD)"
RAW = "urn:li:dataset:(urn:li:dataPlatform:file,user_events,PROD)"


@pytest.fixture
def demo(platform):
    platform.store.apply(load_metadata(DEMO))
    generate_user_events(platform.settings.landing_dir / "user_events", rows=1200, files=2, seed=21)
    return platform


def run_demo(platform):
    from tests.test_pipeline_e2e import run_pipeline

    result = run_pipeline(platform)
    assert result.success
    return result


def _value(p: dict) -> dict:
    return json.loads(p["aspect"]["value"])


def test_demo_pipeline_proposals_with_column_lineage(demo, gms):
    result = run_demo(demo)
    keys = set(gms.keys())
    # datasets with schemas: the landing source and the three Iceberg tables
    for urn in (RAW, BRONZE, SILVER, GOLD):
        assert (urn, "datasetProperties") in keys and (urn, "schemaMetadata") in keys, urn
    gold_schema = [_value(p) for p in gms.aspects("schemaMetadata") if p["entityUrn"] == GOLD][-1]
    assert {f["fieldPath"] for f in gold_schema["fields"]} == {"event_date", "total_events", "unique_users"}
    # table and column lineage, as the SQL says
    lineage = [_value(p) for p in gms.aspects("upstreamLineage") if p["entityUrn"] == GOLD][-1]
    assert [u["dataset"] for u in lineage["upstreams"]] == [SILVER]
    fine = {(tuple(f["downstreams"]), tuple(f["upstreams"])) for f in lineage["fineGrainedLineages"]}
    assert ((f"urn:li:schemaField:({GOLD},unique_users)",), (f"urn:li:schemaField:({SILVER},user_id)",)) in fine
    assert ((f"urn:li:schemaField:({GOLD},event_date)",), (f"urn:li:schemaField:({SILVER},event_ts)",)) in fine
    bronze_up = [_value(p) for p in gms.aspects("upstreamLineage") if p["entityUrn"] == BRONZE][-1]
    assert [u["dataset"] for u in bronze_up["upstreams"]] == [RAW]
    # pipeline and stages as DataFlow / DataJob with inputs and outputs
    flow = "urn:li:dataFlow:(dagster,user_events_etl,PROD)"
    assert (flow, "dataFlowInfo") in keys
    jobs = {p["entityUrn"]: _value(p) for p in gms.aspects("dataJobInputOutput")}
    gold_job = jobs[f"urn:li:dataJob:({flow},gold_aggregate)"]
    assert gold_job["inputDatasets"] == [SILVER] and gold_job["outputDatasets"] == [GOLD]
    assert gold_job["fineGrainedLineages"]
    # one run per stage with its outcome
    ends = [_value(p) for p in gms.aspects("dataProcessInstanceRunEvent") if _value(p)["status"] == "COMPLETE"]
    assert len(ends) == 3 and {e["result"]["type"] for e in ends} == {"SUCCESS"}
    dpi_props = [_value(p) for p in gms.aspects("dataProcessInstanceProperties")]
    assert {p["customProperties"]["run_id"] for p in dpi_props} == {result.run_id}
    # validation: every rule an assertion, every evaluation a run event with the real result
    infos = {p["entityUrn"]: _value(p) for p in gms.aspects("assertionInfo")}
    assert {i["customProperties"]["rule"] for i in infos.values()} >= {"event_id_unique", "totals_cover_users"}
    results = {(infos[p["entityUrn"]]["customProperties"]["rule"], _value(p)["result"]["type"])
               for p in gms.aspects("assertionRunEvent")}
    assert ("event_id_unique", "SUCCESS") in results and ("totals_cover_users", "SUCCESS") in results
    assert any(req == ("POST", "/aspects?action=ingestProposalBatch") for req in gms.requests)
    assert not datahub.pending_batches(demo)


def test_outage_during_run_then_everything_delivered(demo, gms):
    gms.stop()  # DataHub is down for the whole run
    run_demo(demo)  # ...and the data run does not care
    assert gms.proposals == []
    spooled = [(x.entityUrn, x.aspectName) for p in datahub.pending_batches(demo) for x in datahub.read_mcp_file(p)]
    assert len(spooled) > 50
    assert datahub.status(demo).endswith(f"{len(spooled)} proposal(s) waiting")

    gms.start()  # back, on the same port
    res = datahub.replay(demo)
    assert res.pending == 0 and res.delivered == len(spooled)
    assert gms.keys() == spooled  # every proposal, in order, exactly once
    assert not datahub.pending_batches(demo)
    assert any(a == "upstreamLineage" and u == GOLD for u, a in gms.keys())


def test_outage_between_stages_keeps_order(demo, gms, monkeypatch):
    """The server goes away after the first stage's emission and comes back before the next run's."""
    from lakehouse.stage.runner import StageRunner

    r = StageRunner(demo, "user_events_etl", "bronze_ingest", run_id="runa0001")
    r.load(r.extract())
    first = len(gms.proposals)
    assert first > 0
    gms.stop()
    s = StageRunner(demo, "user_events_etl", "silver_clean", run_id="runa0001")
    s.load(s.extract())
    assert len(gms.proposals) == first and datahub.pending_batches(demo)
    gms.start()
    g = StageRunner(demo, "user_events_etl", "gold_aggregate", run_id="runa0001")
    g.load(g.extract())  # the next emission flushes the spool first, then its own batch
    assert not datahub.pending_batches(demo)
    dpi = [p["entityUrn"] for p in gms.aspects("dataProcessInstanceProperties")]
    assert len(dpi) == 3 == len(set(dpi))


def test_no_gms_writes_metadata_file_the_datahub_cli_accepts_and_replays(demo, gms, monkeypatch, tmp_path):
    monkeypatch.delenv("DATAHUB_GMS_URL")
    run_demo(demo)
    files = sorted((demo.settings.home / "datahub" / "mcps").glob("*.json"))
    assert len(files) == 3 and gms.proposals == []
    out = tmp_path / "catalog_mcps.json"
    res = datahub.emit_catalog(demo, output=str(out))
    assert res.written > 20
    for f in [out, *files]:
        chk = subprocess.run([DATAHUB_CLI, "check", "metadata-file", str(f)], capture_output=True, text=True,
                             timeout=300)
        assert chk.returncode == 0, chk.stdout + chk.stderr
    # `datahub ingest mcps` replays the file into a GMS later
    env = {**os.environ, "DATAHUB_GMS_URL": gms.url, "DATAHUB_GMS_TOKEN": ""}
    env.pop("DATAHUB_GMS_TOKEN")
    ing = subprocess.run([DATAHUB_CLI, "ingest", "mcps", str(out)], capture_output=True, text=True, env=env,
                         timeout=300, cwd=tmp_path)
    assert ing.returncode == 0, ing.stdout[-2000:] + ing.stderr[-2000:]
    assert len(gms.proposals) == res.written
    assert any(a == "upstreamLineage" and u == GOLD for u, a in gms.keys())
    assert any(a == "assertionRunEvent" for _, a in gms.keys())  # from the check history


def test_failed_audit_emits_failure_and_failed_assertion(demo, gms):
    from lakehouse.metadata.model import ValidationRuleSet
    from lakehouse.stage.runner import AuditFailed, StageRunner

    rules = demo.catalog().rule_set("bronze_events_rules")
    strict = [r.model_copy(update={"min": 10**9}) if r.name == "not_empty" else r for r in rules.rules]
    demo.store.upsert([ValidationRuleSet(rule_set_id="bronze_events_rules", rules=strict)])
    r = StageRunner(demo, "user_events_etl", "bronze_ingest", run_id="runf0001")
    with pytest.raises(AuditFailed):
        r.load(r.extract())
    ends = [_value(p) for p in gms.aspects("dataProcessInstanceRunEvent") if _value(p)["status"] == "COMPLETE"]
    assert [e["result"]["type"] for e in ends] == ["FAILURE"]
    infos = {p["entityUrn"]: _value(p)["customProperties"]["rule"] for p in gms.aspects("assertionInfo")}
    results = {infos[p["entityUrn"]]: _value(p)["result"] for p in gms.aspects("assertionRunEvent")}
    assert results["not_empty"]["type"] == "FAILURE"
    assert results["event_id_present"]["type"] in ("SUCCESS", "FAILURE")
