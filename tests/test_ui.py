"""The operator's view, in a real browser: headless Debian Chromium (Playwright) against a
`dagster dev` started on the demo metadata (tests/fixtures/dagster_dev.py).

One server is shared by the tests of this module and they build on each other in file order:
the graph is browsed, the demo pipeline is materialized from the UI, then the arrival sensor is
switched on in the UI and a bad batch is landed; its run shows the failing checks and a message
that names dataset, stage, rule and next step; last, a daily time-partitioned target over the demo's
silver table shows its partitions and is backfilled for a range of days from its asset page. A
failing test leaves a screenshot in test-output/.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from playwright.sync_api import Page

pytestmark = [pytest.mark.browser, pytest.mark.slow]

REPO = Path(__file__).resolve().parent.parent
LOCATION = "lakehouse"
PIPELINE = "user_events_etl"
SENSOR = "lakehouse_arrivals"  # one arrival sensor over every source
SCHEDULE = f"{PIPELINE}__schedule"
RUN_TIMEOUT_MS = 15 * 60_000


def expect(actual):
    """Playwright's `expect`, imported by the first test that asserts with it: importing Playwright costs
    ~0.3 s, and every collection of the suite (the fast lane's too) imports this module."""
    from playwright.sync_api import expect as playwright_expect

    return playwright_expect(actual)


def open_page(page: Page, server, path: str) -> None:
    page.goto(server.url + path)
    page.wait_for_load_state("domcontentloaded")


def expected_groups(server) -> dict[str, set[str]]:
    """group -> asset names, from the Definitions built (in a subprocess) on the server's control DB."""
    import subprocess
    import sys

    code = ("import json\n"
            "from lakehouse_assets.definitions import build_definitions\n"
            "graph = build_definitions().resolve_asset_graph()\n"
            "out = {}\n"
            "for node in graph.asset_nodes: out.setdefault(node.group_name, []).append(node.key.path[-1])\n"
            "print(json.dumps(out))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=server.env, capture_output=True, text=True,
                          check=True, timeout=300)
    return {g: set(v) for g, v in json.loads(proc.stdout.strip().splitlines()[-1]).items()}


def land_bad_batch(landing: Path) -> Path:
    """A negative user id (silver warn rule user_id_positive) and an unknown event type (silver error
    rule known_event_type): bronze takes it, the silver audit keeps it off main."""
    rows = [
        {"event_id": "bad-1", "user_id": -5, "event_type": "view", "event_ts": "2026-11-03 10:00:00",
         "country": "US", "context": {"device": "web", "app_version": "1.0"}},
        {"event_id": "bad-2", "user_id": 9, "event_type": "teleport", "event_ts": "2026-11-03 11:00:00",
         "country": "DE", "context": {"device": "ios", "app_version": "1.1"}},
    ]
    path = landing / "late" / "user_events_bad.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tmp.rename(path)  # arrive atomically: the sensor never sees half a file
    return path


def tags(run: dict) -> dict[str, str]:
    return {t["key"]: t["value"] for t in run["tags"]}


def test_asset_graph_shows_layer_groups_and_their_assets(page, dagster_dev):
    groups = expected_groups(dagster_dev)
    assert {"bronze", "silver", "gold"} <= set(groups)
    if (REPO / "metadata" / "demo" / "entity_raw.yaml").exists():
        assert "entity_raw" in groups
    open_page(page, dagster_dev, "/asset-groups")
    expect(page.get_by_text("Global asset lineage")).to_be_visible()
    for group in groups:
        expect(page.get_by_text(group, exact=True).first).to_be_visible()
    for group, assets in groups.items():
        open_page(page, dagster_dev, f"/locations/{LOCATION}/asset-groups/{group}")
        for name in assets:
            expect(page.get_by_text(name, exact=True).first).to_be_visible()


def test_materialize_all_from_the_ui_succeeds(page, dagster_dev):
    """A pipeline is selected in the lineage by its assets' tag (there is no job per pipeline) and
    materialized with "Materialize all": the run is the asset job with exactly its stages selected."""
    before = {r["runId"] for r in dagster_dev.runs()}
    open_page(page, dagster_dev, "/asset-groups")
    # the selection box is a CodeMirror editor: its textarea takes the keys
    page.get_by_role("textbox", name="Search and filter assets").focus()
    page.keyboard.type(f'tag:"lakehouse/pipeline"="{PIPELINE}"')
    page.keyboard.press("Enter")
    expect(page.get_by_text("Materialize all", exact=True)).to_be_visible()  # no count: the filtered graph's
    button = page.get_by_role("button", name=re.compile(r"Materialize all$"))
    expect(button).to_be_enabled()
    button.click()
    run = dagster_dev.wait_for_run(lambda r: r["runId"] not in before, terminal=False, timeout=120)
    selected = dagster_dev.graphql("query($id: ID!) { runOrError(runId: $id) { ... on Run { jobName "
                                   "assetSelection { path } } } }", {"id": run["runId"]})["runOrError"]
    assert sorted("/".join(k["path"]) for k in selected["assetSelection"]) == [
        "bronze/user_events", "gold/daily_user_events", "silver/user_events"], selected
    # Wait off-page: a live run page costs a whole core in Chromium, which the run itself needs on 2 cores.
    page.goto("about:blank")
    finished = dagster_dev.wait_for_run(lambda r: r["runId"] == run["runId"], timeout=RUN_TIMEOUT_MS / 1000)
    assert finished["status"] == "SUCCESS", dagster_dev.log_tail()
    open_page(page, dagster_dev, f"/runs/{run['runId']}")
    expect(page.get_by_text("Success", exact=True).first).to_be_visible()
    assets = ("bronze / user_events", "silver / user_events", "gold / daily_user_events")
    page.get_by_text(f"{len(assets)} assets", exact=True).first.hover()
    page.get_by_text("View list", exact=True).first.click()
    dialog = page.get_by_role("dialog")
    for asset in assets:
        expect(dialog.get_by_text(asset, exact=True).first).to_be_visible()
    for asset in assets:  # and each asset's latest materialization is this run's
        path = asset.split(" / ")
        data = dagster_dev.graphql("query($k: AssetKeyInput!) { assetOrError(assetKey: $k) { ... on Asset { "
                                   "assetMaterializations(limit: 1) { runId } } } }", {"k": {"path": path}})
        assert data["assetOrError"]["assetMaterializations"][0]["runId"] == run["runId"], asset


def test_arrival_sensor_switched_on_in_the_ui_launches_a_run(page, dagster_dev):
    land_bad_batch(dagster_dev.landing)  # before the switch: the first tick must already see it
    open_page(page, dagster_dev, f"/locations/{LOCATION}/sensors/{SENSOR}")
    running = page.get_by_role("row", name="Running")
    toggle = running.get_by_role("checkbox")  # a visually hidden input behind a switch drawn in SVG
    expect(toggle).not_to_be_checked()
    running.locator("label").click()  # where a person clicks: the switch
    expect(toggle).to_be_checked()
    run = dagster_dev.wait_for_run(lambda r: tags(r).get("dagster/sensor_name") == SENSOR, timeout=600)
    assert run["status"] == "FAILURE"  # the silver audit stopped the bad batch (next test shows why)
    page.reload()
    expect(page.get_by_text(run["runId"][:8]).first).to_be_visible(timeout=120_000)
    expect(page.get_by_text(re.compile("1 run requested|Requested", re.I)).first).to_be_visible()


def test_failed_run_names_dataset_stage_rule_and_next_step(page, dagster_dev):
    run = dagster_dev.wait_for_run(lambda r: tags(r).get("dagster/sensor_name") == SENSOR, timeout=60)
    open_page(page, dagster_dev, f"/runs/{run['runId']}")
    expect(page.get_by_text("Failure", exact=True).first).to_be_visible(timeout=120_000)
    message = page.get_by_text(re.compile(r"silver\.user_events \(stage user_events_etl\.silver_clean\) failed "
                                          r"blocking rule\(s\) known_event_type")).first
    expect(message).to_be_attached()
    expect(page.get_by_text(re.compile(r"lakehouse branches show silver\.user_events")).first).to_be_attached()
    # the audit failed before the stage's output existed: the run materialized no silver/user_events
    data = dagster_dev.graphql("query($k: AssetKeyInput!) { assetOrError(assetKey: $k) { ... on Asset { "
                               "assetMaterializations(limit: 5) { runId } } } }", {"k": {"path": ["silver", "user_events"]}})
    assert run["runId"] not in {m["runId"] for m in data["assetOrError"]["assetMaterializations"]}


def test_asset_checks_listed_with_last_results(page, dagster_dev):
    open_page(page, dagster_dev, "/assets/silver/user_events?view=checks")
    expect(page.get_by_text("Checks (3)")).to_be_visible()
    rows = {  # check -> (status in the list, evaluation result in its panel, failed rows of the bad batch)
        "event_id_unique": ("Succeeded", "Passed", "0"),
        "known_event_type": ("Failed", "Failed", "1"),
        "user_id_positive": ("Failed", "Failed", "1"),
    }
    for check, (listed, result, failed_rows) in rows.items():
        # the list entry is the innermost element holding both the check's name and its status
        item = page.locator("div").filter(has=page.get_by_text(check, exact=True)).filter(has_text=listed).last
        expect(item).to_be_visible()
        item.click()
        panel = page.locator("div").filter(has=page.get_by_text("Evaluation result", exact=True)) \
            .filter(has=page.get_by_text(check, exact=True)).last
        expect(panel.get_by_text(result, exact=True).first).to_be_visible()
        failed = panel.get_by_role("row").filter(has=page.get_by_text("failed_rows", exact=True)).first
        expect(failed.get_by_text(failed_rows, exact=True)).to_be_visible()


def test_sensors_and_metadata_schedules_are_listed(page, dagster_dev):
    open_page(page, dagster_dev, "/automation")
    expect(page.get_by_text(SENSOR, exact=True).first).to_be_visible()
    expect(page.get_by_text(SCHEDULE, exact=True).first).to_be_visible()
    expect(page.get_by_text("data_quality_dashboard_refresh", exact=True).first).to_be_visible()
    open_page(page, dagster_dev, f"/locations/{LOCATION}/schedules/{SCHEDULE}")
    expect(page.get_by_text("0 * * * *").first).to_be_visible()


def test_pools_from_throttles_metadata_in_concurrency_settings(page, dagster_dev):
    assert dagster_dev.pools == {"source:user_events_raw": 2, "target:bronze_user_events": 1}
    open_page(page, dagster_dev, "/deployment/concurrency")
    for pool, limit in dagster_dev.pools.items():
        page.get_by_placeholder("Filter pools").fill(pool)  # one row left: the pool and its limit
        expect(page.get_by_role("link", name=pool, exact=True)).to_be_visible()
        expect(page.get_by_text(str(limit), exact=True).first).to_be_visible()
        other = next(p for p in dagster_dev.pools if p != pool)
        expect(page.get_by_role("link", name=other, exact=True)).to_have_count(0)


def test_data_quality_dashboard_is_shown_in_the_ui(page, dagster_dev):
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:  # refreshed by its sensor after the bad batch's run
        runs = [r for r in dagster_dev.runs() if tags(r).get("lakehouse/dashboard") and r["status"] == "SUCCESS"]
        if any(tags(r).get("lakehouse/after_run") for r in runs) and len(runs) >= 1:
            sensor_run = dagster_dev.wait_for_run(lambda r: tags(r).get("dagster/sensor_name") == SENSOR)
            if any(tags(r).get("lakehouse/after_run") == sensor_run["runId"] for r in runs):
                break
        time.sleep(5)
    else:
        raise AssertionError(f"no dashboard refresh after the bad batch: {dagster_dev.runs()}")
    open_page(page, dagster_dev, "/assets/ops/data_quality_dashboard")
    metadata = page.get_by_role("row").filter(has=page.get_by_text("overview", exact=True)).first
    metadata.get_by_text("[Show Markdown]").click()
    dialog = page.get_by_role("dialog")
    expect(dialog.get_by_text("known_event_type").first).to_be_visible()
    expect(dialog.get_by_text("❌ FAIL").first).to_be_visible()
    image = dialog.locator("img[alt='data quality overview']").first
    expect(image).to_be_visible()
    assert image.evaluate("img => img.naturalWidth") > 100


EVENTS_BY_DAY = """
pipelines:
  - {pipeline_id: events_by_day, owner: team:analytics}
targets:
  - target_id: gold_events_by_day
    namespace: gold
    table: events_by_day
    write_mode: overwrite
    partition_spec: [{column: day, transform: identity}]
    time_partition: {column: day, start_date: "2026-11-01", upstream: "CAST(event_ts AS DATE)"}
stages:
  - pipeline_id: events_by_day
    stage_order: 1
    stage_name: rollup
    layer: gold
    target_id: gold_events_by_day
    validation_set_id: events_by_day_rules
    transformation: >-
      SELECT CAST(event_ts AS DATE) AS day, count(*) AS events FROM silver.user_events GROUP BY CAST(event_ts AS DATE)
validation_rules:
  - rule_set_id: events_by_day_rules
    rules:
      - {name: events_positive, type: expression, expression: "events > 0", severity: error}
"""


def reload_location(server) -> None:
    """What an operator does after `metadata apply` (Deployment → Reload): the code location is rebuilt."""
    server.graphql(f'mutation {{ reloadRepositoryLocation(repositoryLocationName: "{LOCATION}") {{ __typename }} }}')
    deadline = time.monotonic() + 300
    query = "{ workspaceOrError { ... on Workspace { locationEntries { loadStatus } } } }"
    while time.monotonic() < deadline:
        if all(e["loadStatus"] == "LOADED" for e in server.graphql(query)["workspaceOrError"]["locationEntries"]):
            return
        time.sleep(1)
    raise TimeoutError(f"code location not reloaded:\n{server.log_tail()}")


def test_time_partitioned_asset_shows_its_partitions_and_a_range_is_backfilled(page, dagster_dev, tmp_path):
    """A target declaring a daily `time_partition` is a daily-partitioned asset: its page's Partitions
    tab lists every day since start_date, and a range typed in the launch dialog is backfilled (one run,
    single-run policy) rewriting exactly those days, which the tab then shows as materialized."""
    import dagster as dg
    from pyiceberg.catalog.sql import SqlCatalog

    from tests.fixtures.dagster_dev import lakehouse_cli

    (tmp_path / "md").mkdir()
    (tmp_path / "md" / "events_by_day.yaml").write_text(EVENTS_BY_DAY)
    lakehouse_cli(dagster_dev.env, "metadata", "apply", str(tmp_path / "md"))  # merged into the demo's metadata
    reload_location(dagster_dev)
    days = dg.DailyPartitionsDefinition(start_date="2026-11-01").get_partition_keys()  # up to yesterday (UTC)
    assert len(days) >= 3 and days[0] == "2026-11-01"

    open_page(page, dagster_dev, "/assets/gold/events_by_day?view=partitions")
    expect(page.get_by_text(f"{len(days)} Partitions Selected", exact=True)).to_be_visible()
    expect(page.get_by_text(f"Missing ({len(days)})", exact=True)).to_be_visible()
    expect(page.get_by_text("Materialized (0)", exact=True)).to_be_visible()
    for day in (days[0], days[-1]):
        expect(page.get_by_text(day, exact=True).first).to_be_visible()

    before = {r["runId"] for r in dagster_dev.runs()}
    page.get_by_text("Materialize…", exact=True).first.click()
    dialog = page.get_by_role("dialog")
    dialog.get_by_role("textbox").first.click()  # the partition selection: a range, as the tab's own box shows it
    page.keyboard.type("[2026-11-02...2026-11-04]")
    page.keyboard.press("Enter")
    expect(dialog.get_by_text("3 partitions", exact=True)).to_be_visible()
    expect(dialog.get_by_text("Backfills all partitions in a single run.")).to_be_visible()
    dialog.get_by_role("button", name="Launch backfill").click()
    run = dagster_dev.wait_for_run(lambda r: r["runId"] not in before and tags(r).get("dagster/backfill"),
                                   terminal=False, timeout=300)
    page.goto("about:blank")  # wait off-page: the run needs the cores
    finished = dagster_dev.wait_for_run(lambda r: r["runId"] == run["runId"], timeout=RUN_TIMEOUT_MS / 1000)
    assert finished["status"] == "SUCCESS", dagster_dev.log_tail()
    assert (tags(finished)["dagster/asset_partition_range_start"],
            tags(finished)["dagster/asset_partition_range_end"]) == ("2026-11-02", "2026-11-04")

    # an independent reader: the table holds exactly those days, each with its silver rows
    home = dagster_dev.home
    cat = SqlCatalog("lake", uri=f"sqlite:///{home / 'catalog.db'}", warehouse=f"file://{home / 'warehouse'}")
    got = {str(r["day"]): r["events"] for r in cat.load_table("gold.events_by_day").scan().to_arrow().to_pylist()}
    silver = cat.load_table("silver.user_events").scan(selected_fields=("event_ts",)).to_arrow().to_pylist()
    want = {d: sum(1 for r in silver if str(r["event_ts"])[:10] == d) for d in ("2026-11-02", "2026-11-03", "2026-11-04")}
    assert got == want and all(want.values()), (got, want)

    open_page(page, dagster_dev, "/assets/gold/events_by_day?view=partitions")
    expect(page.get_by_text("Materialized (3)", exact=True)).to_be_visible()
    expect(page.get_by_text(f"Missing ({len(days) - 3})", exact=True)).to_be_visible()


EVENTS = ["gold", "events_by_day"]


def materialization_count(server, path: list[str]) -> int:
    data = server.graphql("query($k: AssetKeyInput!) { assetOrError(assetKey: $k) { ... on Asset { "
                          "assetMaterializations(limit: 1000) { runId } } } }", {"k": {"path": path}})
    return len(data["assetOrError"]["assetMaterializations"])


def latest_check_status(server, path: list[str], check: str) -> tuple[str, str]:
    data = server.graphql("query($k: AssetKeyInput!, $c: String!) { assetCheckExecutions(assetKey: $k, checkName: $c, "
                          "limit: 1) { runId status } }", {"k": {"path": path}, "c": check})
    latest = data["assetCheckExecutions"][0]
    return latest["runId"], latest["status"]


def test_partitions_a_cli_run_wrote_a_no_op_run_and_a_skipped_check_as_the_ui_shows_them(page, dagster_dev):
    """Issue 39's operator views, after the backfill above: a `lakehouse run` (not a UI launch) of the daily
    gold shows every day it loaded as materialized on the Partitions tab (the days counted independently from
    silver); a second run with nothing new adds no materialization to the asset's history, only an observation
    saying why; with the stage disabled, the run skips it and its check is shown as skipped, never as passed."""
    from pyiceberg.catalog.sql import SqlCatalog

    from tests.fixtures.dagster_dev import lakehouse_cli

    home = dagster_dev.home
    cat = SqlCatalog("lake", uri=f"sqlite:///{home / 'catalog.db'}", warehouse=f"file://{home / 'warehouse'}")
    import dagster as dg

    days = set(dg.DailyPartitionsDefinition(start_date="2026-11-01").get_partition_keys())
    silver = cat.load_table("silver.user_events").scan(selected_fields=("event_ts",)).to_arrow().to_pylist()
    loaded = {str(r["event_ts"])[:10] for r in silver} & days
    assert len(loaded) > 3, loaded  # more days than the backfill wrote: the run's own days show

    out = lakehouse_cli(dagster_dev.env, "run", "events_by_day").stdout
    assert "events_positive ok" in out, out
    open_page(page, dagster_dev, "/assets/gold/events_by_day?view=partitions")
    expect(page.get_by_text(f"Materialized ({len(loaded)})", exact=True)).to_be_visible()
    expect(page.get_by_text(f"Missing ({len(days) - len(loaded)})", exact=True)).to_be_visible()
    history = materialization_count(dagster_dev, EVENTS)

    # nothing new: the asset's history gains no materialization; the run says why, as an observation
    out = lakehouse_cli(dagster_dev.env, "run", "events_by_day").stdout
    assert materialization_count(dagster_dev, EVENTS) == history, out
    open_page(page, dagster_dev, "/assets/gold/events_by_day?view=events")
    expect(page.get_by_text("nothing new since snapshot").first).to_be_visible()
    open_page(page, dagster_dev, "/assets/gold/events_by_day?view=partitions")
    expect(page.get_by_text(f"Materialized ({len(loaded)})", exact=True)).to_be_visible()

    # a disabled stage: the run skips it, the check is planned and not evaluated; the UI says skipped
    lakehouse_cli(dagster_dev.env, "stage", "disable", "events_by_day", "rollup")
    try:
        out = lakehouse_cli(dagster_dev.env, "run", "events_by_day").stdout
    finally:
        lakehouse_cli(dagster_dev.env, "stage", "enable", "events_by_day", "rollup")
    assert "events_positive not evaluated" in out, out
    run_id = out.split()[1]
    assert latest_check_status(dagster_dev, EVENTS, "events_positive") == (run_id, "SKIPPED")
    open_page(page, dagster_dev, "/assets/gold/events_by_day?view=checks")
    item = page.locator("div").filter(has=page.get_by_text("events_positive", exact=True)).filter(
        has_text="Skipped").last
    expect(item).to_be_visible()
    expect(page.locator("div").filter(has=page.get_by_text("events_positive", exact=True)).filter(
        has_text="Succeeded")).to_have_count(0)
