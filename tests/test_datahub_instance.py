"""A stage run's DataHub proposals without acryl-datahub's ingestion framework (issue 21: a small
`lakehouse run` imports only what it uses): the DataProcessInstance aspects and the metadata file
must be exactly what the library's own helpers produce, so DataHub (and `datahub check
metadata-file`) see no difference."""

from __future__ import annotations

import json

import pytest

from lakehouse.lineage import datahub


def _job(inlets: int):
    from datahub.api.entities.datajob import DataJob
    from datahub.utilities.urns.data_flow_urn import DataFlowUrn
    from datahub.utilities.urns.dataset_urn import DatasetUrn

    return DataJob(id="ingest", flow_urn=DataFlowUrn.from_string(datahub.flow_urn("bench")), name="ingest",
                   properties={"layer": "bronze"},
                   inlets=[DatasetUrn.from_string(f"urn:li:dataset:(urn:li:dataPlatform:file,in{i},PROD)")
                           for i in range(inlets)],
                   outlets=[DatasetUrn.from_string("urn:li:dataset:(urn:li:dataPlatform:iceberg,bronze.events,PROD)")])


@pytest.mark.parametrize("success", [True, False])
@pytest.mark.parametrize("inlets", [0, 2])
def test_instance_proposals_equal_the_library_helpers(success, inlets):
    from datahub.api.entities.dataprocess.dataprocess_instance import DataProcessInstance, InstanceRunResult

    job = _job(inlets)
    props = {"run_id": "r1", "pipeline": "bench", "stage": "ingest", "rows_written": "999"}
    dpi = DataProcessInstance.from_datajob(job, id="r1.ingest", clone_inlets=True, clone_outlets=True)
    dpi.properties = dict(props)
    expected = [*dpi.generate_mcp(created_ts_millis=1_000, materialize_iolets=False), *dpi.start_event_mcp(1_000),
                *dpi.end_event_mcp(4_500, InstanceRunResult.SUCCESS if success else InstanceRunResult.FAILURE,
                                   start_timestamp_millis=1_000)]
    ours = datahub.instance_mcps(job, "r1.ingest", props, 1_000, 4_500, success)
    assert [x.to_obj() for x in ours] == [x.to_obj() for x in expected]
    assert {x.aspectName for x in ours} >= {"dataProcessInstanceProperties", "dataProcessInstanceRunEvent"}
    assert json.loads(json.dumps(ours[-1].to_obj()))["aspect"]["value"]  # serializable as GMS receives it


def test_metadata_file_is_byte_for_byte_the_library_writer(tmp_path):
    from datahub.ingestion.sink.file import write_metadata_file

    job = _job(1)
    mcps = [*job.generate_mcp(materialize_iolets=False),
            *datahub.instance_mcps(job, "r1.ingest", {"run_id": "r1"}, 1_000, 2_000, True)]
    for items, name in ((mcps, "some"), ([], "none")):
        write_metadata_file(tmp_path / f"lib-{name}.json", items)
        datahub.write_mcp_file(tmp_path / f"ours-{name}.json", items)
        assert (tmp_path / f"ours-{name}.json").read_bytes() == (tmp_path / f"lib-{name}.json").read_bytes()
    assert len(datahub.read_mcp_file(tmp_path / "ours-some.json")) == len(mcps)
