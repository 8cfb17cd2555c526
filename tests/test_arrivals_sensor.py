"""One arrival sensor for every source (issue 22): one evaluation per tick lists every landing zone
(in parallel), keeps a cursor per source, skips a switched-off source with its reason, survives a
source whose listing fails, and shows each source's state on its asset. Fast: local landing zones,
an ephemeral instance, no Spark."""

from __future__ import annotations

import json

import dagster as dg
import pytest

from lakehouse.cli.demo import generate_user_events
from lakehouse.metadata.loader import load_metadata
from lakehouse.metadata.store import MetadataStore
from lakehouse.settings import load_settings
from lakehouse.stage.runner import Platform
from sensors.arrivals import SENSOR_NAME
from tests.fixtures.ticks import tick as evaluate_tick
from tests.test_derived_metadata import copies


@pytest.fixture
def three(tmp_path, monkeypatch):
    monkeypatch.setenv("LAKEHOUSE_HOME", str(tmp_path))
    for var in ("LAKEHOUSE_CONTROL_DB_URL", "LAKEHOUSE_LANDING_DIR", "LAKEHOUSE_CATALOG_URI"):
        monkeypatch.delenv(var, raising=False)
    MetadataStore(f"sqlite:///{tmp_path / 'control.db'}").apply(load_metadata(copies(tmp_path / "meta", 3)))
    platform = Platform(load_settings(), MetadataStore(f"sqlite:///{tmp_path / 'control.db'}"))
    for i in range(3):
        (platform.settings.landing_dir / f"landing{i}").mkdir(parents=True)
    from lakehouse_assets.definitions import build_definitions

    defs = build_definitions(platform)
    return platform, defs, defs.get_sensor_def(SENSOR_NAME)


def tick(defs, sensor, instance, cursor):
    return evaluate_tick(sensor, defs, instance=instance, cursor=cursor)


def states(result) -> dict[str, str]:
    return {e.metadata["stage"].value.split(".")[0]: e.metadata["status"].value for e in result.asset_events or []}


def test_one_tick_for_every_source_with_a_cursor_and_a_state_each(three, monkeypatch):
    platform, defs, sensor = three
    assert [s.name for s in defs.sensors if "arrival" in s.name and "entity_raw" not in s.name] == [SENSOR_NAME]
    generate_user_events(platform.settings.landing_dir / "landing0", rows=20, files=2, seed=1)
    platform.store.set_enabled("pipeline", "p1", False, by="test")
    instance = dg.DagsterInstance.ephemeral()

    first = tick(defs, sensor, instance, None)
    [req] = first.run_requests  # the two files fit one batch
    # the asset job with the stage and what follows it selected: its run worker builds pipeline p0 only
    assert req.job_name == defs.resolve_implicit_global_asset_job_def().name
    assert req.asset_selection == [dg.AssetKey(["bronze", "user_events0"]), dg.AssetKey(["silver", "user_events0"]),
                                   dg.AssetKey(["gold", "daily_user_events0"])]
    assert (req.tags["lakehouse/source"], req.tags["lakehouse/stage"], req.tags["lakehouse/files"]) == (
        "raw0", "bronze_ingest", "2")
    assert states(first) == {"p0": "new_files", "p1": "disabled", "p2": "idle"}  # first tick: every source
    obs = {e.asset_key: e for e in first.asset_events}
    # a pipeline's kill switch says who threw it and when
    assert obs[dg.AssetKey(["sources", "raw1"])].metadata["reason"].value.startswith("pipeline p1 disabled by test at ")
    cursor = json.loads(first.cursor)
    assert set(cursor["cursors"]) == {"p0.bronze_ingest"}  # one cursor per source that has seen files

    second = tick(defs, sensor, instance, first.cursor)
    assert not second.run_requests
    assert states(second) == {"p0": "idle"}  # only a change of state is an event
    assert second.skip_message.startswith("3 source(s): 1 disabled, 2 idle; disabled: p1.bronze_ingest: pipeline p1 "
                                          "disabled by test at "), second.skip_message

    # a source whose listing fails is that source's state, not the tick's
    import lakehouse.ingest.arrivals as arrivals

    real = arrivals.list_local_files

    def flaky(source, landing):
        if source.source_id == "raw2":
            raise PermissionError(f"cannot list {landing}/{source.path}")
        return real(source, landing)

    monkeypatch.setattr(arrivals, "list_local_files", flaky)
    generate_user_events(platform.settings.landing_dir / "landing0" / "later", rows=5, files=1, seed=2)
    third = tick(defs, sensor, instance, second.cursor)
    assert [r.tags["lakehouse/source"] for r in third.run_requests] == ["raw0"]
    assert states(third) == {"p0": "new_files", "p2": "error"}
    assert "PermissionError" in {e.asset_key: e for e in third.asset_events}[
        dg.AssetKey(["sources", "raw2"])].metadata["reason"].value
    assert json.loads(third.cursor)["cursors"]["p0.bronze_ingest"] != cursor["cursors"]["p0.bronze_ingest"]

    # every listing failing is a failed tick (red in the UI), not a quiet skip
    platform.store.set_enabled("pipeline", "p1", True, by="test")
    monkeypatch.setattr(arrivals, "list_local_files", lambda source, landing: (_ for _ in ()).throw(OSError("down")))
    with pytest.raises(Exception, match="every source's listing failed"):
        tick(defs, sensor, instance, third.cursor)
