"""The loops that used to run on their own now run through lakehouse/runtime/retry.py's named policies, and
stop where docs/errors.md says (fast: no Spark, no server).

* riding out a database outage (`retry.OUTAGE`): calls repeat with backoff until the window is
  spent, then `DatabaseUnavailable`; the waits add up to the window, never past it;
* the catalog's "already exists" creation race (`retry.CREATE_RACE`): recognised by the one mapper
  (`errors.already_exists`: SQLSTATE, or SQLite's own error) and repeated exactly its attempts;
* the claim race (`retry.INSERT_RACE`): an IntegrityError (another run inserted first) makes the claim
  read again, up to its attempts; real claims on a SQLite control DB still come out exact.
"""

from __future__ import annotations

import sqlite3

import pytest
import sqlalchemy as sa

from lakehouse import errors
from lakehouse.metadata.store import MetadataStore
from lakehouse.platform import Platform
from lakehouse.runtime import coordination, outage, retry
from lakehouse.settings import load_settings


class Clock:
    """time.monotonic and sleep for the outage loop: sleeping moves the clock, nothing waits."""

    def __init__(self):
        self.now = 1000.0
        self.waits: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.waits.append(s)
        self.now += s


@pytest.fixture
def clock(monkeypatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(outage.time, "monotonic", c.monotonic)
    monkeypatch.setattr(outage, "_down_since", {})
    return c


def test_an_outage_is_ridden_out_for_its_window_and_no_longer(clock, monkeypatch):
    monkeypatch.setenv(outage.ENV_WINDOW, "10")
    calls = []

    def refused():
        calls.append(clock.now)
        raise ConnectionRefusedError("Connection refused")

    with pytest.raises(errors.DatabaseUnavailable, match="outage window of 10s"):
        outage.ride_out(refused, database="db:5432/ctl", what="testing", sleep=clock.sleep)
    # 0.5, 1, 2, 4 (doubling), then the 2.5 s left of the window: six calls, ten seconds
    assert clock.waits == [0.5, 1.0, 2.0, 4.0, 2.5]
    assert len(calls) == 6 and sum(clock.waits) == 10.0
    # the window is the outage's, not the call's: a second call while it lasts is not waited for again
    with pytest.raises(errors.DatabaseUnavailable):
        outage.ride_out(refused, database="db:5432/ctl", what="testing again", sleep=clock.sleep)
    assert len(calls) == 7


def test_an_outage_that_ends_inside_the_window_is_not_an_error(clock, monkeypatch):
    monkeypatch.setenv(outage.ENV_WINDOW, "10")
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionResetError("Connection reset by peer")
        return "ok"

    assert outage.ride_out(flaky, database="db", what="testing", sleep=clock.sleep) == "ok"
    assert len(calls) == 3 and clock.waits == [0.5, 1.0]
    assert "db" not in outage._down_since  # recovered: the next outage gets a window of its own


def test_the_catalog_creation_race_is_recognised_by_the_mapper_not_by_words(tmp_path):
    con = sqlite3.connect(tmp_path / "c.db")
    con.execute("CREATE TABLE iceberg_tables (x int)")
    with pytest.raises(sqlite3.OperationalError) as raw:
        con.execute("CREATE TABLE iceberg_tables (x int)")
    assert errors.already_exists(raw.value)
    eng = sa.create_engine(f"sqlite:///{tmp_path / 'c.db'}")
    with pytest.raises(sa.exc.OperationalError) as wrapped, eng.begin() as conn:
        conn.execute(sa.text("CREATE TABLE iceberg_tables (x int)"))
    assert errors.already_exists(wrapped.value)

    class PgDuplicateTable(Exception):
        pgcode = "42P07"

    assert errors.already_exists(PgDuplicateTable("relation exists"))
    assert not errors.already_exists(ValueError("table already exists"))  # words alone classify nothing
    calls = []

    def lose_the_race():
        calls.append(1)
        raise raw.value

    with pytest.raises(sqlite3.OperationalError):
        retry.call(retry.CREATE_RACE, lose_the_race, what="t", also=errors.already_exists, sleep=lambda _s: None)
    assert len(calls) == retry.CREATE_RACE.attempts


def test_a_claim_that_loses_the_insert_race_reads_again_within_its_policy(tmp_path, monkeypatch):
    """run-2 reads no claim, then run-1 (a run without a lease: dead) inserts the same item before
    run-2 does: run-2's insert hits the unique key, it reads again (one repeat of INSERT_RACE) and
    takes the dead run's claim over. Exactly two reads, the item claimed once."""
    monkeypatch.setenv("LAKEHOUSE_HOME", str(tmp_path))
    monkeypatch.delenv("LAKEHOUSE_CONTROL_DB_URL", raising=False)
    settings = load_settings()
    platform = Platform(settings, MetadataStore(settings.control_db_url))
    platform.store.create_all()
    eng = coordination.engine_for(platform)
    real_leases = coordination.leases
    reads = []

    def leases_while_run_1_inserts(p, table):
        reads.append(1)
        if len(reads) == 1:  # between run-2's read and its insert
            with eng.begin() as conn:
                conn.execute(sa.insert(coordination.work_claims).values(
                    table_ident=table, work_key="a.jsonl", version="e1", run_key=coordination.run_key("run-1"),
                    claimed_at=0.0))
        return real_leases(p, table)

    monkeypatch.setattr(coordination, "leases", leases_while_run_1_inserts)
    result = coordination.claim(platform, "bronze.t", "run-2", [("a.jsonl", "e1"), ("b.jsonl", "e2")])
    assert len(reads) == 2
    assert result.mine == [("a.jsonl", "e1"), ("b.jsonl", "e2")] and not result.taken
    with eng.connect() as conn:
        holders = conn.execute(sa.select(coordination.work_claims.c.run_key)).scalars().all()
    assert holders == [coordination.run_key("run-2")] * 2
