"""Stage SQL goes to DataHub as a Query entity (acryl-datahub's QueryProperties / QuerySubjects)
linked to the datasets it reads and writes, and named by the lineage edges the stage makes; checked
at the local GMS (real DatahubRestEmitter over a socket) and by `datahub check metadata-file`."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from lakehouse.lineage import datahub
from lakehouse.metadata.loader import load_metadata
from tests.test_datahub import BRONZE, DATAHUB_CLI, DEMO, GOLD, RAW, SILVER

pytestmark = pytest.mark.slow  # a local GMS server; the datahub CLI as a subprocess


def test_sql_stages_are_query_entities_linked_to_their_datasets(settings, gms, tmp_path):
    from lakehouse.metadata.store import MetadataStore
    from lakehouse.stage.runner import Platform

    platform = Platform(settings, MetadataStore(settings.control_db_url))
    platform.store.apply(load_metadata(DEMO))
    catalog = platform.catalog()
    res = datahub.emit_catalog(platform)
    assert res.pending == 0 and res.delivered == res.written

    gold = catalog.stage("user_events_etl", "gold_aggregate")
    q = datahub.query_urn(gold)
    assert q.startswith("urn:li:query:")
    props = [json.loads(p["aspect"]["value"]) for p in gms.aspects("queryProperties") if p["entityUrn"] == q]
    assert props, "no queryProperties for the gold stage"
    assert props[-1]["statement"] == {"value": gold.transformation.strip(), "language": "SQL"}
    assert props[-1]["origin"] == datahub.job_urn(gold) and props[-1]["name"] == "user_events_etl.gold_aggregate"
    subjects = [json.loads(p["aspect"]["value"]) for p in gms.aspects("querySubjects") if p["entityUrn"] == q][-1]
    assert [s["entity"] for s in subjects["subjects"]] == [SILVER, GOLD]
    # two SQL stages, two queries; the bronze stage reads files, no SQL, no query
    assert {p["entityUrn"] for p in gms.aspects("queryProperties")} == {
        q, datahub.query_urn(catalog.stage("user_events_etl", "silver_clean"))}

    lineage = [json.loads(p["aspect"]["value"]) for p in gms.aspects("upstreamLineage") if p["entityUrn"] == GOLD][-1]
    assert [(u["dataset"], u.get("query")) for u in lineage["upstreams"]] == [(SILVER, q)]
    assert {f.get("query") for f in lineage["fineGrainedLineages"]} == {q}
    bronze = [json.loads(p["aspect"]["value"]) for p in gms.aspects("upstreamLineage") if p["entityUrn"] == BRONZE][-1]
    assert [(u["dataset"], u.get("query")) for u in bronze["upstreams"]] == [(RAW, None)]

    # DataHub's own validator accepts the file form of the same proposals
    out = tmp_path / "catalog.json"
    datahub.emit_catalog(platform, output=str(out))
    check = subprocess.run([DATAHUB_CLI, "check", "metadata-file", str(out)], capture_output=True, text=True,
                           timeout=300, cwd=Path(__file__).resolve().parent.parent)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "queryProperties" in out.read_text() and "querySubjects" in out.read_text()
