"""A disabled pipeline's schedule and arrival sensor on a REAL `dagster-daemon run` (issue 39, item 1).

The pipeline's schedule (every minute) and the arrival sensor are switched on while the pipeline is
disabled and a file waits in its landing folder: every tick the daemon evaluates is SKIPPED with the
reason (who disabled it, when, the command that re-enables it) and no run is created. The pipeline is
an Arrow-engine one, so nothing here needs a JVM.
"""

from __future__ import annotations

import json
import time

import pytest

from lakehouse.cli import main as cli
from lakehouse.metadata.loader import load_metadata
from lakehouse.metadata.store import MetadataStore

META = """
pipelines:
  - {pipeline_id: tk, schedule: "* * * * *"}
sources:
  - {source_id: tk_raw, kind: files, format: jsonl, path: tk, glob: "*.jsonl"}
targets:
  - {target_id: tk_bronze, namespace: bronze, table: tk, engine: arrow}
stages:
  - {pipeline_id: tk, stage_order: 1, stage_name: ingest, layer: bronze, source_id: tk_raw, target_id: tk_bronze}
"""


def ticks_by_status(instance, remote) -> dict[str, list]:
    out: dict[str, list] = {}
    for t in instance.get_ticks(remote.get_remote_origin_id(), remote.selector_id):
        out.setdefault(t.status.value, []).append(t)
    return out


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_disabled_pipelines_ticks_skip_with_the_reason_on_a_real_daemon(settings, tmp_path,
                                                                           dagster_daemon_factory):
    store = MetadataStore(settings.control_db_url)
    (tmp_path / "tk.yaml").write_text(META)
    store.apply(load_metadata(tmp_path / "tk.yaml"))
    landing = settings.landing_dir / "tk"
    landing.mkdir(parents=True)
    (landing / "a.jsonl").write_text(json.dumps({"id": 1}) + "\n")
    assert cli(["pipeline", "disable", "tk"]) == 0

    d = dagster_daemon_factory(max_concurrent_runs=1, start=False)
    inst = d.instance
    inst.get_runs(limit=1)  # create the instance's storage before daemon and code server race for it
    inst.all_instigator_state()
    d.start()
    repo = next(iter(d._request_context().get_code_location(d.location_name).get_repositories().values()))
    schedule = repo.get_schedule("tk__schedule")
    sensor = repo.get_sensor("lakehouse_arrivals")
    inst.start_schedule(schedule)
    inst.start_sensor(sensor)

    deadline = time.monotonic() + 300  # the schedule ticks at the next minute boundary
    while time.monotonic() < deadline:
        if all(ticks_by_status(inst, r).get("SKIPPED") for r in (schedule, sensor)):
            break
        time.sleep(2)
    else:
        raise AssertionError(f"no skipped tick of both within 300 s: schedule {ticks_by_status(inst, schedule)}, "
                             f"sensor {ticks_by_status(inst, sensor)}\n{d.log_tail()}")
    inst.stop_sensor(sensor.get_remote_origin_id(), sensor.selector_id, sensor)
    inst.stop_schedule(schedule.get_remote_origin_id(), schedule.selector_id, schedule)

    sched_ticks, sensor_ticks = ticks_by_status(inst, schedule), ticks_by_status(inst, sensor)
    assert set(sched_ticks) == {"SKIPPED"} and set(sensor_ticks) == {"SKIPPED"}, (sched_ticks, sensor_ticks)
    reason = sched_ticks["SKIPPED"][0].skip_reason
    assert reason.startswith("pipeline tk disabled by cli at "), reason
    assert "Re-enable with `lakehouse pipeline enable tk`" in reason, reason
    assert "disabled: tk.ingest: pipeline tk disabled by cli at " in sensor_ticks["SKIPPED"][0].skip_reason
    assert inst.get_runs() == []  # no run was created, so none could start a JVM or be cancelled later
