"""Source adapters: every kind the metadata model knows has one, found by kind; planning a landing
directory and an S3 prefix needs neither Spark nor the runner (a `StageContext` is enough); the
S3 adapter reads through dagster-aws's S3Resource with the endpoint the platform configures."""

from __future__ import annotations

import typing

import dagster as dg
import pytest
from dagster_aws.s3 import S3Resource

from lakehouse.ingest.paths import PathEscape
from lakehouse.metadata.loader import load_metadata
from lakehouse.metadata.model import Source
from lakehouse.metadata.store import MetadataStore
from lakehouse.platform import Platform
from lakehouse.runtime import coordination
from lakehouse.runtime.s3access import S3Clients
from lakehouse.sources import adapter_for, kinds
from lakehouse.sources.base import SourceAdapter, register
from lakehouse.stage.core import PYTHON, SQL, ExtractPlan, FileRef, StageContext
from lakehouse.table.publish import Overlap, PublishResult
from lakehouse_assets.definitions import _resources
from resources import LakehouseResource

META = """
pipelines:
  - {{pipeline_id: p}}
sources:
  - {{source_id: landing, kind: files, format: jsonl, path: events, glob: "*.jsonl", max_files_per_run: 2}}
  - {{source_id: bucket, kind: s3, format: jsonl, bucket: {bucket}, prefix: in/, glob: "*.jsonl"}}
targets:
  - {{target_id: t_files, namespace: b, table: from_files}}
  - {{target_id: t_s3, namespace: b, table: from_s3}}
stages:
  - {{pipeline_id: p, stage_order: 1, stage_name: files, layer: bronze, source_id: landing, target_id: t_files}}
  - {{pipeline_id: p, stage_order: 2, stage_name: s3, layer: bronze, source_id: bucket, target_id: t_s3}}
"""


def _platform(settings, tmp_path, bucket: str = "nobucket", s3: S3Clients | None = None) -> Platform:
    f = tmp_path / "meta.yaml"
    f.write_text(META.format(bucket=bucket))
    platform = Platform(settings, MetadataStore(settings.control_db_url), s3)
    platform.store.apply(load_metadata(f))
    return platform


def _plan(ctx: StageContext) -> ExtractPlan:
    plan = ExtractPlan(ctx.stage.pipeline_id, ctx.stage.stage_name, kind=ctx.source_kind,
                       source_id=ctx.stage.source_id)
    ctx.adapter_for = adapter_for
    ctx.adapter().plan(ctx, ctx.source, plan)
    return plan


def test_every_source_kind_of_the_metadata_model_has_an_adapter():
    model_kinds = set(typing.get_args(Source.model_fields["kind"].annotation))
    assert model_kinds == {"files", "s3", "jdbc", "iceberg"}  # a new kind in the model needs an adapter here
    assert set(kinds()) == model_kinds | {SQL, PYTHON, "entity_raw"}
    for kind in kinds():
        adapter = adapter_for(kind)
        assert isinstance(adapter, SourceAdapter) and adapter.kind == kind
    with pytest.raises(KeyError, match=r"no source adapter for kind 'ftp'; known kinds: \['entity_raw', 'files'"):
        adapter_for("ftp")


def test_a_kind_cannot_be_registered_twice():
    class Other(SourceAdapter):
        kind = "files"

    with pytest.raises(ValueError, match="registered twice"):
        register(Other)
    assert type(adapter_for("files")).__name__ == "FilesAdapter"


def test_the_files_adapter_plans_new_landing_files_without_spark(settings, tmp_path):
    platform = _platform(settings, tmp_path)
    landing = settings.landing_dir / "events"
    landing.mkdir(parents=True)
    for name in ("a.jsonl", "b.jsonl", "c.jsonl", "skip.csv"):
        (landing / name).write_text('{"id": 1}\n')
    ctx = StageContext(platform, "p", "files", run_id="r1")
    coordination.hold_lease(platform, "r1", ctx.target.identifier)  # what the extract step holds: claims live with it
    plan = _plan(ctx)
    assert plan.kind == "files" and plan.skipped_reason is None
    assert [f.key for f in plan.files] == ["a.jsonl", "b.jsonl"]  # max_files_per_run 2, by the glob
    assert plan.details == {"files_found": 3, "files_new": 3, "files_planned": 2}
    # a second run planning now finds the files claimed by the first (still live: same process)
    other = _plan(StageContext(platform, "p", "files", run_id="r2"))
    assert [f.key for f in other.files] == ["c.jsonl"]
    assert "r1" in other.details["files_claimed_by_other_runs"]
    coordination.release_lease(platform, "r1", ctx.target.identifier)


def test_the_files_adapter_probe_and_remainder(settings, tmp_path):
    platform = _platform(settings, tmp_path)
    adapter, src = adapter_for("files"), platform.catalog().source("landing")
    ok, why = adapter.probe(platform, src)
    assert not ok and "does not exist" in why
    (settings.landing_dir / "events").mkdir(parents=True)
    assert adapter.probe(platform, src)[0] is True
    plan = ExtractPlan("p", "files", "files", files=[FileRef("a", 1, "e1"), FileRef("b", 1, "e2")])
    taken = PublishResult(published=False, snapshot_id=None,
                          overlap=Overlap(files={"other-run": {("a", "e1")}}, covers_all=False))
    assert [f.key for f in adapter.remainder(plan, taken).files] == ["b"]


def test_the_entity_raw_adapter_finds_request_files_through_the_applications_source(settings, tmp_path):
    platform = _platform(settings, tmp_path)
    src = platform.catalog().source("landing")
    landing = settings.landing_dir / "events"
    (landing / "a").mkdir(parents=True)
    for name in ("a/1.jsonl", "a/2.jsonl", "b.txt", "c.txt"):
        (landing / name).write_text("x\n")
    adapter = adapter_for("entity_raw")
    files, location = adapter.find_files(platform, src, ["b.txt"], ["a/*.jsonl"], "load request for 'app'")
    assert [f.key for f in files] == ["a/1.jsonl", "a/2.jsonl", "b.txt"] and location == f"file://{landing}/"
    assert all(f.local_path == str(landing / f.key) for f in files)
    assert adapter.stage_files(platform, src, files, location, "r1", "entity_raw x") == (files, None)
    with pytest.raises(PathEscape, match="load request for 'app': file key '../meta.yaml' is refused"):
        adapter.find_files(platform, src, ["../meta.yaml"], [], "load request for 'app'")
    with pytest.raises(FileNotFoundError, match="file key 'nope.txt' not found"):
        adapter.find_files(platform, src, ["nope.txt"], [], "load request for 'app'")


@pytest.mark.slow  # moto_server is a server process
def test_the_s3_adapter_plans_and_stages_through_the_s3_resource(settings, tmp_path, s3_server, monkeypatch):
    monkeypatch.delenv("LAKEHOUSE_S3_ENDPOINT_URL", raising=False)
    bucket = s3_server.new_bucket()
    client = s3_server.client()
    for name in ("in/1.jsonl", "in/2.jsonl", "in/x.csv", "other/3.jsonl"):
        client.put_object(Bucket=bucket, Key=name, Body=b'{"id": 1}\n')
    made: list[tuple[str | None, int]] = []
    resource = S3Resource(endpoint_url=s3_server.endpoint_url, region_name="us-east-1")
    clients = S3Clients.from_resource(resource)
    real = clients._factory
    clients._factory = lambda ep, attempts: made.append((ep, attempts)) or real(ep, attempts)
    platform = _platform(settings, tmp_path, bucket, clients)
    ctx = StageContext(platform, "p", "s3", run_id="r1")
    plan = _plan(ctx)
    assert [f.key for f in plan.files] == ["in/1.jsonl", "in/2.jsonl"]
    assert all(f.local_path and f.local_path.startswith(str(settings.staging_dir)) for f in plan.files)
    assert plan.details["listing"] == "full" and plan.details["files_downloaded"] == 2
    # every client came from the resource, with its endpoint; one client serves list and download
    assert made == [(s3_server.endpoint_url, 5)]
    ok, why = adapter_for("s3").probe(platform, ctx.source)
    assert ok, why
    assert made[-1] == (s3_server.endpoint_url, 1)  # a probe makes a single attempt
    gone = ctx.source.model_copy(update={"bucket": "no-such-bucket-here"})
    assert adapter_for("s3").probe(platform, gone)[0] is False


def test_the_s3_probe_answers_when_the_endpoint_accepts_and_never_replies(settings, tmp_path):
    """A black-holed endpoint (the socket accepts, nothing answers) is reported unreachable by the
    probe's own deadline, not after botocore's 60 s read timeout (S3Resource sets none)."""
    import socket

    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(8)  # connections complete in the backlog; nobody ever reads or writes
    try:
        endpoint = f"http://127.0.0.1:{hole.getsockname()[1]}"
        clients = S3Clients.from_resource(S3Resource(endpoint_url=endpoint, region_name="us-east-1",
                                                     aws_access_key_id="k", aws_secret_access_key="s"))
        platform = _platform(settings, tmp_path, "held", clients)
        ok, why = adapter_for("s3").probe(platform, platform.catalog().source("bucket"), timeout_s=0.5)
        assert not ok
        assert why == "s3://held: no answer from the endpoint within 0.5 s"
    finally:
        hole.close()


def test_dagster_steps_get_their_s3_clients_from_the_s3_resource(settings, monkeypatch):
    """The S3Resource nested in LakehouseResource is what a step's platform makes clients from;
    the code location nests none (importing dagster-aws costs every code load ~1.4 s): its steps
    make the same S3Resource from settings on first use; no credential is configuration."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "from-env")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret-from-env")
    monkeypatch.setenv("LAKEHOUSE_S3_ENDPOINT_URL", "http://127.0.0.1:9")
    configured = _resources()["lakehouse"]
    assert configured.s3 is None
    made = configured.platform().s3
    assert made.for_source(None).meta.endpoint_url == "http://127.0.0.1:9"
    assert made.for_source(None)._request_signer._credentials.access_key == "from-env"
    seen = {}

    @dg.asset
    def probe_endpoint(lakehouse: LakehouseResource) -> None:
        platform = lakehouse.platform()
        client = platform.s3.for_source(None)
        seen["endpoint"] = client.meta.endpoint_url
        seen["same_client"] = client is platform.s3.for_source(None)
        seen["key"] = client._request_signer._credentials.access_key

    resource = LakehouseResource(s3=S3Resource(endpoint_url="http://127.0.0.1:7", region_name="us-east-1"))
    assert dg.materialize([probe_endpoint], resources={"lakehouse": resource}).success
    assert seen == {"endpoint": "http://127.0.0.1:7", "same_client": True, "key": "from-env"}
