"""The Dagster shim (lakehouse/compat/dagster.py) was written against private Dagster APIs of the
versions it names: on any other installed Dagster this fails, so an upgrade re-reads the shim
(does Dagster now serialise SQLite slot claims, lock the first creation, offer a public way to
submit a code location's run?) before it is taken."""

from __future__ import annotations

import dagster
import pytest

from lakehouse.compat import dagster as compat


def test_the_installed_dagster_is_one_the_shim_was_written_for():
    minor = ".".join(dagster.__version__.split(".")[:2])
    assert minor in compat.SUPPORTED, (
        f"dagster {dagster.__version__} is installed; lakehouse/compat/dagster.py was written for "
        f"{', '.join(compat.SUPPORTED)}: check its private imports and overrides, then add {minor}")


@pytest.mark.parametrize("name", ["claim_concurrency_slot", "free_concurrency_slots_for_run",
                                  "free_concurrency_slot_for_step", "set_concurrency_slots",
                                  "delete_concurrency_limit", "initialize_concurrency_limit_to_default"])
def test_every_slot_method_the_shim_serialises_is_still_dagsters(name):
    """The overrides keep Dagster's signatures: the method still exists on Dagster's storage."""
    import inspect

    ours = inspect.signature(getattr(compat.SerializedSqliteEventLogStorage, name))
    theirs = inspect.signature(getattr(compat.SqliteEventLogStorage, name))
    assert list(ours.parameters) == list(theirs.parameters)


def test_the_storage_opens_and_claims_a_slot(tmp_path):
    """An instance on the shim's storage (as deploy/dagster.dev.yaml configures it) works through
    Dagster's public instance API, and a pool of limit 1 gives its slot to one claimer."""
    import dagster as dg
    import yaml

    home = tmp_path / "dh"
    home.mkdir()
    (home / "dagster.yaml").write_text(yaml.safe_dump({"storage": {"custom": {
        "module": "lakehouse.compat.dagster", "class": "LakehouseSqliteStorage",
        "config": {"base_dir": str(home)}}}, "telemetry": {"enabled": False}}))
    instance = dg.DagsterInstance.from_config(str(home))
    storage = instance.event_log_storage
    assert isinstance(storage, compat.SerializedSqliteEventLogStorage)
    storage.set_concurrency_slots("p", 1)
    assert storage.claim_concurrency_slot("p", "r1", "a").is_claimed
    assert not storage.claim_concurrency_slot("p", "r2", "b").is_claimed
    storage.free_concurrency_slot_for_step("r1", "a")
    assert storage.claim_concurrency_slot("p", "r2", "b").is_claimed
    assert (home / compat.INIT_DONE).exists()
    instance.dispose()
