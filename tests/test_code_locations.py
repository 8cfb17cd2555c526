"""Several code locations (issue 22): `Pipeline.code_location` splits the definitions, so a reload after
`metadata apply` rebuilds only the location that changed. No Spark: definitions are built from a
SQLite control DB; the workspace test starts the two code servers Dagster starts for a workspace
(slow lane: a running part of a Dagster deployment)."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest
import yaml

from lakehouse.cli import main as cli
from lakehouse.metadata.loader import MetadataError, load_metadata
from lakehouse.metadata.locations import code_locations, touched_locations
from lakehouse.stage.runner import Platform
from tests.test_derived_metadata import copies, home  # noqa: F401 - the fixture

LOCATIONS = {"p0": None, "p1": "west", "p2": "west", "p3": None}


def split(out: Path) -> Path:
    """Four demo pipelines: p1, p2 in location `west`; p2's gold reads p0's silver (a default-location
    table), p3's gold reads p1's silver (a `west` table)."""
    copies(out, 4)
    doc = yaml.safe_load((out / "pipelines.yaml").read_text())
    for p in doc["pipelines"]:
        if LOCATIONS[p["pipeline_id"]]:
            p["code_location"] = LOCATIONS[p["pipeline_id"]]
    (out / "pipelines.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    for reader, producer in ((2, 0), (3, 1)):
        sql = out / "sql" / f"gold{reader}.sql"
        sql.write_text(sql.read_text().replace(f"silver.user_events{reader}", f"silver.user_events{producer}"))
    return out


@pytest.fixture
def applied(home):  # noqa: F811
    meta = split(home / "meta")
    assert cli(["metadata", "apply", str(meta)]) == 0
    return Platform.from_env()


def stage_keys(defs: dg.Definitions) -> dict[str, set[str]]:
    """{pipeline: its stage asset keys} of materializable assets, and the external specs under ''."""
    out: dict[str, set[str]] = {}
    for node in defs.resolve_asset_graph().asset_nodes:
        pid = node.tags.get("lakehouse/pipeline") if node.is_materializable else ""
        if pid is not None:
            out.setdefault(pid, set()).add(node.key.to_user_string())
    return out


def test_each_location_holds_its_pipelines_and_reads_the_others_as_external(applied):
    from lakehouse_assets.definitions import build_definitions

    west = build_definitions(applied, location="west")
    default = build_definitions(applied, location="lakehouse")
    w, d = stage_keys(west), stage_keys(default)
    assert set(w) - {""} == {"p1", "p2"} and set(d) - {""} == {"p0", "p3"}
    assert w["p1"] == {"bronze/user_events1", "silver/user_events1", "gold/daily_user_events1"}
    # the table p2 reads from the default location is an external spec here, and the other way round
    assert "silver/user_events0" in w[""] and "silver/user_events1" in d[""]
    assert not any(k.startswith(("bronze/user_events0", "gold/")) for k in w[""])
    # what is not per pipeline lives in the default location only
    jobs = {j.name for j in default.jobs or []}
    assert jobs and not list(west.jobs or [])
    sensors_w = {s.name for s in west.sensors or []}
    assert sensors_w == {"lakehouse_arrivals"}, sensors_w
    assert "lakehouse_arrivals" in {s.name for s in default.sensors or []}
    assert {s.name for s in west.schedules or []} and all("p1" in s.name or "p2" in s.name for s in west.schedules)
    # without locations in the metadata the default location is the whole platform, as before
    whole = stage_keys(build_definitions(applied))
    assert set(whole) - {""} == {"p0", "p1", "p2", "p3"}


@pytest.mark.slow  # a subprocess tree: Dagster starts a code server (`dagster api grpc`) per location, one after
# the other, each importing Dagster and building its definitions (4-7 s of the fast lane)
def test_workspace_loads_both_locations_and_resolves_the_cross_location_dependency(applied, home, monkeypatch):  # noqa: F811
    from dagster._core.workspace.context import WorkspaceProcessContext
    from dagster._core.workspace.load_target import WorkspaceFileTarget

    assert code_locations(applied.store) == {"lakehouse": 2, "west": 2}
    out = home / "workspace.yaml"
    assert cli(["workspace", "--output", str(out)]) == 0
    entries = yaml.safe_load(out.read_text())["load_from"]
    assert [e["python_module"]["location_name"] for e in entries] == ["lakehouse", "west"]
    assert entries[0]["python_module"]["attribute"] == "defs"  # the repository's own workspace.yaml entry
    monkeypatch.chdir(Path(__file__).resolve().parents[1])
    (home / "dagster_home").mkdir()
    with dg.instance_for_test(temp_dir=str(home / "dagster_home")) as instance, \
            WorkspaceProcessContext(instance, WorkspaceFileTarget(paths=[str(out)])) as ctx:
        workspace = ctx.create_request_context()
        errors = {n: e.load_error for n, e in workspace.get_code_location_entries().items() if e.load_error}
        assert not errors, errors
        graph = workspace.asset_graph
        node = graph.get(dg.AssetKey(["silver", "user_events0"]))
        # materialized in the default location, read (external) by west's p2
        homes = {info.handle.location_name: info.asset_node.is_materializable for info in node.repo_scoped_asset_infos}
        assert homes == {"lakehouse": True, "west": False}
        assert dg.AssetKey(["gold", "daily_user_events2"]) in graph.get(dg.AssetKey(["silver", "user_events0"])).child_keys
        west_gold = graph.get(dg.AssetKey(["gold", "daily_user_events2"]))
        assert west_gold.resolve_to_singular_repo_scoped_node().repository_handle.location_name == "west"


def test_apply_reports_the_locations_it_touched(applied, home, capsys):  # noqa: F811
    meta = home / "meta"
    doc = yaml.safe_load((meta / "pipelines.yaml").read_text())
    capsys.readouterr()
    for p in doc["pipelines"]:
        if p["pipeline_id"] == "p1":
            p["description"] = "changed"
    (meta / "pipelines.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    assert cli(["metadata", "apply", str(meta)]) == 0
    assert "code locations changed: west\n" in capsys.readouterr().out
    assert cli(["metadata", "apply", str(meta)]) == 0  # nothing changed
    assert "code locations changed: none" in capsys.readouterr().out
    # a pipeline moved: both locations; a shared rule set: every location whose stages name it
    before = applied.store.load()
    moved = before.model_copy(update={"pipelines": [p.model_copy(update={"code_location": "east"})
                                                    if p.pipeline_id == "p0" else p for p in before.pipelines]})
    assert touched_locations(before, moved) == {"lakehouse", "east"}
    rules = before.model_copy(update={"validation_rules": [r.model_copy(update={"description": "x"})
                                                           for r in before.validation_rules]})
    assert touched_locations(before, rules) == {"lakehouse", "west"}


@pytest.mark.parametrize("bad", ["west-1", "1west", "a b", "../x", ""])
def test_a_hostile_location_name_is_rejected_naming_pipeline_and_file(tmp_path, bad):
    meta = split(tmp_path / "meta")
    doc = yaml.safe_load((meta / "pipelines.yaml").read_text())
    doc["pipelines"][1]["code_location"] = bad
    (meta / "pipelines.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    with pytest.raises(MetadataError) as err:
        load_metadata(meta, check_refs=False)
    text = str(err.value)
    assert "pipelines.yaml" in text and "code_location" in text and "p1" in text, text


def test_the_module_resolves_a_location_attribute_lazily_and_rejects_a_bad_one():
    import lakehouse_assets.definitions as module

    assert module.location__lakehouse is module.defs
    west = module.location__west
    assert isinstance(west, dg.RepositoryDefinition) and module.location__west is west
    with pytest.raises(ValueError, match="not a valid identifier"):
        getattr(module, "location__a-b")
    assert not hasattr(module, "something_else")


@pytest.mark.slow
@pytest.mark.timeout(2400)  # a JVM in the run worker on a loaded 2-core machine
def test_a_run_of_a_pipeline_in_another_location_runs_there_and_builds_its_location(
        settings, tmp_path, dagster_daemon_factory):
    """A daemon serving location `west` alone (`location__west`, as `lakehouse workspace` names it)
    launches p1's run; its run worker loads the same attribute and builds location `west` alone (not
    every location's pipelines); the run materializes p1 for real and reads nothing it must not."""
    import json
    import time

    from lakehouse.cli.demo import generate_user_events
    from lakehouse.metadata.store import MetadataStore

    MetadataStore(settings.control_db_url).apply(load_metadata(split(tmp_path / "meta")))
    generate_user_events(settings.landing_dir / "landing1", rows=300, files=2, seed=4)
    trace = tmp_path / "defs_trace.jsonl"
    d = dagster_daemon_factory(extra_env={"LAKEHOUSE_DEFS_TRACE": str(trace)}, attribute="location__west",
                               location_name="west")
    run_id = d.submit_pipeline("p1")
    [run] = d.wait_for_runs([run_id], timeout=1800)
    assert run.status == dg.DagsterRunStatus.SUCCESS, d.failures([run_id]) + "\n" + d.log_tail()
    assert run.remote_job_origin.location_name == "west"
    mats = {rec.dagster_event.asset_key.to_user_string()
            for rec in d.instance.all_logs(run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION)}
    assert mats == {"bronze/user_events1", "silver/user_events1", "gold/daily_user_events1"}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not trace.exists():
        time.sleep(1)
    builds = [json.loads(x) for x in trace.read_text().splitlines()]
    assert builds and all(b["pipelines"] is None and b["location"] == "west" and b["stage_assets"] == 6
                          for b in builds), builds
    assert len({b["pid"] for b in builds}) >= 2, builds  # the code server's build and the run worker's
