"""Settings reach Dagster through one resource (issue 18 item 4), fast (no Spark, no server).

* `LakehouseResource`'s fields are the platform's settings; a field set wins over the environment,
  a field left unset falls back to it (as the CLI reads it);
* the code location configures each setting its environment sets as an `EnvVar`: the repository
  snapshot the UI shows names the variable and never carries its value (a control DB password);
* assets, sensors and schedules build their platform from the resource they are given, not from
  the environment of the process.
"""

from __future__ import annotations

import dagster as dg
import pytest
from dagster._core.remote_representation.external_data import RepositorySnap
from dagster_shared.serdes import serialize_value

from lakehouse.metadata.model import Throttle
from lakehouse.metadata.store import MetadataStore
from lakehouse.orchestration.pools import current_limits
from lakehouse.settings import ENV_VARS, load_settings
from resources.lakehouse import LakehouseResource
from tests.fixtures.ticks import tick


@pytest.fixture
def clean_env(tmp_path, monkeypatch):
    for var in ENV_VARS.values():
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("LAKEHOUSE_HOME", str(tmp_path / "env_home"))
    return tmp_path


def test_fields_win_over_the_environment_and_unset_fields_fall_back_to_it(clean_env, monkeypatch):
    monkeypatch.setenv("LAKEHOUSE_CATALOG_NAME", "from_env")
    res = LakehouseResource(home=str(clean_env / "res_home"), warehouse="file:///elsewhere")
    s = res.settings()
    assert s.home == (clean_env / "res_home").resolve()
    assert s.control_db_url == f"sqlite:///{s.home / 'control.db'}"  # the default follows the resource's home
    assert s.warehouse == "file:///elsewhere"
    assert s.catalog_name == "from_env"
    assert LakehouseResource().settings() == load_settings()
    with pytest.raises(ValueError, match="unknown setting"):
        load_settings({"control_db": "sqlite://"})


def test_the_code_location_shows_env_var_names_never_a_secret(clean_env, monkeypatch):
    url = "postgresql://lake:s3cr3t-pw@db.example:5432/control"
    monkeypatch.setenv("LAKEHOUSE_CONTROL_DB_URL", url)
    monkeypatch.setenv("LAKEHOUSE_CATALOG_NAME", "prod_lake")
    res = LakehouseResource.from_settings()
    assert isinstance(res.control_db_url, dg.EnvVar) and res.control_db_url.env_var_name == "LAKEHOUSE_CONTROL_DB_URL"
    assert res.home.env_var_name == "LAKEHOUSE_HOME" and res.warehouse is None  # unset: not configured
    assert res.settings().control_db_url == url  # resolved where it is used, from that process's environment

    defs = dg.Definitions(resources={"lakehouse": res})
    repo = defs.get_repository_def()
    used = repo.get_env_vars_by_top_level_resource()  # env var -> the resources reading it
    assert used["LAKEHOUSE_CONTROL_DB_URL"] == used["LAKEHOUSE_CATALOG_NAME"] == {"lakehouse"}
    shown = serialize_value(RepositorySnap.from_def(repo))  # what the webserver gets from the code server
    assert "LAKEHOUSE_CONTROL_DB_URL" in shown
    assert "s3cr3t-pw" not in shown and "prod_lake" not in shown


def test_an_asset_gets_its_platform_from_the_resource(clean_env):
    seen = {}

    @dg.asset(required_resource_keys={"lakehouse"})
    def probe(context) -> None:
        seen["home"] = context.resources.lakehouse.platform().settings.home

    configured = clean_env / "configured_home"
    assert dg.materialize([probe], resources={"lakehouse": LakehouseResource(home=str(configured))}).success
    assert seen["home"] == configured.resolve() != load_settings().home


def test_a_sensor_reads_the_control_db_the_resource_names(clean_env):
    """The throughput sensor syncs pool limits from the throttles of the resource's control DB, while
    the process's environment points at another (empty) one."""
    from sensors.throughput import build_throughput_sensor

    url = f"sqlite:///{clean_env / 'configured.db'}"
    MetadataStore(url).upsert([Throttle(throttle_id="t_conc", entity_type="target", entity_id="t_x",
                                        metric="max_concurrent", threshold=4)])
    instance = dg.DagsterInstance.ephemeral()
    sensor = build_throughput_sensor()
    env_only = tick(sensor, instance=instance)
    assert "target:t_x" not in current_limits(instance), env_only.skip_message
    configured = tick(sensor, dg.Definitions(resources={"lakehouse": LakehouseResource(control_db_url=url)}),
                      instance=instance)
    assert "set target:t_x=4" in configured.skip_message
    assert current_limits(instance)["target:t_x"] == (4, False)


def test_the_platform_is_built_from_the_environment_at_entry_points_only():
    """`Platform.from_env()` / `load_settings()` are called by the CLI (and where they are defined),
    never by an asset, sensor, schedule, IO manager or a domain module deep inside."""
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    entry_points = {"lakehouse/platform.py", "lakehouse/settings.py", "lakehouse_assets/cli.py",
                    "lakehouse/orchestration/instance.py",  # instance_from_env: the CLI's Dagster instance
                    "resources/lakehouse.py", "resources/spark.py",  # the resource itself, its fallback
                    "resources/pyspark_session.py",  # the Spark resource's dagster-pyspark delegate: same fallback
                    "lakehouse/service/client.py"}  # submit_and_poll: a connector's entry point (seed 000's env)
    offenders = []
    for package in ("lakehouse", "lakehouse_assets", "resources", "sensors", "schedules"):
        for path in (repo / package).rglob("*.py"):
            rel = path.relative_to(repo).as_posix()
            if rel in entry_points or path.name == "cli.py" or rel.startswith("lakehouse/cli/"):
                continue
            text = path.read_text()
            offenders += [f"{rel}: {call}" for call in ("from_env(", "load_settings(") if call in text]
    assert offenders == []
