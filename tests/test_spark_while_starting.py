"""`lakehouse run` starts the JVM on a thread of its own (Platform.warm_spark); the step that asks for
the session before it is up would only wait. `lakehouse.runtime.spark.while_starting` gives that step work
that needs no JVM (imports the run needs anyway) to do first, and the file sources probe their
files before asking for the session. No JVM here: the starting thread is played by holding the lock."""

from __future__ import annotations

import threading
import types

import pytest

from lakehouse.runtime import spark as sparkmod
from lakehouse.settings import load_settings


@pytest.fixture
def starting(monkeypatch, tmp_path):
    """Another thread is 'starting' the session: the lock is held until `up(session)` is called."""
    monkeypatch.setenv("LAKEHOUSE_HOME", str(tmp_path))
    monkeypatch.setattr(sparkmod, "_SESSION", None)
    monkeypatch.setattr(sparkmod, "_WHILE_STARTING", [])
    monkeypatch.setattr(sparkmod, "_ensure_catalog", lambda spark, settings: None)
    sparkmod._LOCK.acquire()
    fake = types.SimpleNamespace(sparkContext=types.SimpleNamespace(_jsc=object()))

    def up():
        sparkmod._SESSION = fake
        sparkmod._LOCK.release()

    yield types.SimpleNamespace(up=up, session=fake)
    if sparkmod._LOCK.locked():
        sparkmod._LOCK.release()


def test_a_waiting_thread_does_the_work_first_and_once(starting):
    done: list[tuple[str, bool]] = []
    sparkmod.while_starting(lambda: done.append((threading.current_thread().name, sparkmod._SESSION is None)))
    got: dict = {}
    waiter = threading.Thread(target=lambda: got.setdefault("s", sparkmod.get_spark(load_settings())), name="step")
    waiter.start()
    for _ in range(200):  # the work runs while the session is still being started
        if done:
            break
        threading.Event().wait(0.01)
    assert done == [("step", True)]
    assert waiter.is_alive()  # and then the step waits for the session, as before
    starting.up()
    waiter.join(5)
    assert got["s"] is starting.session
    assert sparkmod._WHILE_STARTING == []
    sparkmod.get_spark(load_settings())
    assert len(done) == 1


def test_no_work_without_a_wait_and_withdrawn_work_never_runs(starting):
    ran: list[str] = []
    withdraw = sparkmod.while_starting(lambda: ran.append("withdrawn"))
    sparkmod.while_starting(lambda: ran.append("late"))
    withdraw()
    starting.up()  # the session is up before any step asks: nobody waits, the work is left undone
    assert sparkmod.get_spark(load_settings()) is starting.session
    assert ran == []


def test_work_is_registered_once_and_not_once_the_session_is_up(starting):
    def work():
        pass

    sparkmod.while_starting(work)
    sparkmod.while_starting(work)  # every `lakehouse run` of a long-lived process asks again
    assert sparkmod._WHILE_STARTING == [work]
    starting.up()
    sparkmod._WHILE_STARTING.clear()
    sparkmod.while_starting(work)
    assert sparkmod._WHILE_STARTING == []


def test_work_stops_once_the_session_is_up(starting):
    ran: list[str] = []
    sparkmod.while_starting(lambda: (ran.append("first"), starting.up()))  # the JVM comes up meanwhile
    sparkmod.while_starting(lambda: ran.append("second"))
    assert sparkmod.get_spark(load_settings()) is starting.session
    assert ran == ["first"]  # the second is not worth a wait any more: left where it is needed


def test_failing_work_does_not_fail_the_step(starting):
    sparkmod.while_starting(lambda: 1 / 0)
    ran: list[str] = []
    sparkmod.while_starting(lambda: ran.append("next"))
    t = threading.Thread(target=sparkmod.get_spark, args=(load_settings(),))
    t.start()
    for _ in range(200):
        if ran:
            break
        threading.Event().wait(0.01)
    starting.up()
    t.join(5)
    assert ran == ["next"] and not t.is_alive()


def test_file_sources_probe_before_asking_for_the_session(monkeypatch):
    from lakehouse.sources import filebased

    order: list[str] = []

    def prepare(ctx, spark, src, todo, schema_io=None):
        order.append(f"prepare spark={spark!r}")
        return types.SimpleNamespace(files=[])

    monkeypatch.setattr(filebased, "prepare_files", prepare)
    ctx = types.SimpleNamespace(
        source=types.SimpleNamespace(batch_files=4, batch_bytes=1 << 20),
        healing=types.SimpleNamespace(quarantined_files=set(), effective_batch=lambda n: n),
        platform=types.SimpleNamespace(spark=lambda: order.append("spark()") or "session"))
    plan = types.SimpleNamespace(files=[])
    assert list(filebased.FileSourceAdapter().batches(ctx, plan)) == []
    assert order == ["prepare spark=None", "spark()"]
