"""Riding out a short outage of the control database or the Iceberg catalog database.

A database that is restarted, fails over or blinks must not fail a run that would have worked a
few seconds later. Every call that reaches one of those databases goes through `ride_out` (or,
for SQLAlchemy engines, through the `do_connect` hook `install_connect_hook` puts on the engine):
a connection-level failure (refused, reset, "the database system is shutting down", a pooled
connection the server closed) makes the call wait with backoff and try again. One window is
kept per database, starting at the first failure of the current outage: a call that fails when
the database has been unreachable for longer than the window (platform setting
`outage.window_seconds`, default 60 s; `LAKEHOUSE_OUTAGE_WINDOW_SECONDS` overrides it) raises
`DatabaseUnavailable`, naming the database by host and name (never a user or password) and what
to do. Any other error passes through untouched: this module does not classify errors, it only
recognises that the database could not be talked to.

The window in force is the one from the operational metadata read last (the control DB itself
may be the database that is down), see `set_window`.
"""

from __future__ import annotations

import logging
import re
import threading
import time
import weakref
from collections.abc import Callable
from typing import TypeVar

from lakehouse.errors import DatabaseUnavailable
from lakehouse.runtime import retry
from lakehouse.settings import RunSettings, current

log = logging.getLogger(__name__)
T = TypeVar("T")

DEFAULT_WINDOW_S = 60.0
SETTING_KEY = "outage.window_seconds"
ENV_WINDOW = "LAKEHOUSE_OUTAGE_WINDOW_SECONDS"

#: Texts of failures to reach a database (PostgreSQL server, JDBC driver, psycopg2, SQLAlchemy,
#: Iceberg's JDBC client pool). Matched anywhere in the exception chain's text.
_CONNECTION_PATTERNS = re.compile("|".join((
    r"Connection refused",
    r"could not connect to server",
    r"connection to server at .* failed",
    r"the database system is (?:shutting down|starting up|in recovery mode|not yet accepting connections)",
    r"terminating connection due to administrator command",
    r"server closed the connection unexpectedly",
    r"The connection attempt failed",
    r"Connection to \S+ refused",
    r"An I/O error occurred while sending to the backend",
    r"This connection has been closed",
    r"connection already closed",
    r"SSL SYSCALL error: EOF detected",
    r"Failed to connect: jdbc:",
    r"Cannot initialize JDBC catalog: Connection failed",
    r"no connection to the server",
    r"Connection reset",
    r"EOFException.*(?:postgres|PGStream)",
)), re.I)

_lock = threading.Lock()
_down_since: dict[str, float] = {}
_window_from_metadata: float | None = None


def window_seconds() -> float:
    env = current(RunSettings).outage_window_seconds  # LAKEHOUSE_OUTAGE_WINDOW_SECONDS: process-wide, as the window
    if env is not None:
        return max(0.0, env)
    return DEFAULT_WINDOW_S if _window_from_metadata is None else _window_from_metadata


def set_window(value: str | float | None) -> None:
    """Remember the window of the operational metadata just read (None: the default)."""
    global _window_from_metadata
    try:
        _window_from_metadata = None if value in (None, "") else max(0.0, float(value))
    except (TypeError, ValueError):
        log.warning("platform setting %s=%r is not a number of seconds; using %ss", SETTING_KEY, value,
                    DEFAULT_WINDOW_S)
        _window_from_metadata = None


def is_connection_failure(exc: BaseException) -> bool:
    """True when `exc` (or what it wraps) says the database could not be reached or dropped us."""
    if isinstance(exc, DatabaseUnavailable):
        return False  # already past the window: never wait a second time
    seen, cur = set(), exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if getattr(cur, "connection_invalidated", False):  # SQLAlchemy: the server dropped a pooled connection
            return True
        if isinstance(cur, ConnectionRefusedError | ConnectionResetError):
            return True
        if _CONNECTION_PATTERNS.search(str(cur)):
            return True
        cur = cur.__cause__ or cur.__context__
    return False


def describe_url(url: str) -> str:
    """`host:port/dbname` of a SQLAlchemy or JDBC URL; a file path for SQLite. Never credentials."""
    if not url:
        return "(unknown database)"
    text = url[len("jdbc:"):] if url.startswith("jdbc:") else url
    if text.startswith("sqlite:"):
        return text.split("?", 1)[0].replace("sqlite:///", "").replace("sqlite:", "")
    m = re.match(r"^[a-z0-9+]+://(?:[^@/]*@)?([^/?;]*)(?:/([^?;]*))?", text, re.I)
    if not m:
        return "(unparseable database URL)"
    host, db = m.group(1), m.group(2) or ""
    return f"{host}/{db}" if db else host


def _note_recovered(database: str) -> None:
    with _lock:
        since = _down_since.pop(database, None)
    if since is not None:
        log.warning("database %s is reachable again after %.1fs", database, time.monotonic() - since)


def ride_out(work: Callable[[], T], *, database: str, what: str, role: str = "database",
             sleep: Callable[[float], None] = time.sleep) -> T:
    """Run `work`; while it fails to reach `database`, wait with backoff and retry (the named policy
    `lakehouse.runtime.retry.OUTAGE`), until the outage (counted from its first failure, across calls) is
    longer than the window."""

    def unreachable(exc: BaseException) -> bool:
        if not is_connection_failure(exc):
            return False
        with _lock:
            _down_since.setdefault(database, time.monotonic())
        return True

    def remaining_s() -> float:
        with _lock:
            since = _down_since.get(database)
        return window_seconds() - (time.monotonic() - since if since is not None else 0.0)

    try:
        result = retry.call_within(retry.OUTAGE, work, what=f"{role} {database} unreachable while {what}",
                                   retry_on=unreachable, remaining_s=remaining_s, sleep=sleep)
    except Exception as exc:
        if not unreachable(exc):
            raise
        window = window_seconds()
        down_for = window - remaining_s()
        first = next((ln for ln in str(exc).splitlines() if ln.strip()), type(exc).__name__)
        raise DatabaseUnavailable(
            f"the {role} {database} has been unreachable for {down_for:.0f}s, longer than the "
            f"outage window of {window:.0f}s (platform setting {SETTING_KEY}), while {what}: "
            f"{first[:300]}. Nothing was published by this step. Check that the database is up "
            f"and reachable from this host, then re-run the step (it resumes exactly where main is)."
        ) from exc
    if database in _down_since:
        _note_recovered(database)
    return result


#: the engines given the hook (a set here, not a marker attribute on SQLAlchemy's object)
_HOOKED: weakref.WeakSet = weakref.WeakSet()


def install_connect_hook(engine, *, role: str) -> None:
    """Make every new DBAPI connection of a SQLAlchemy engine ride out an outage (the pool's
    pre-ping turns a connection the server dropped into a reconnect, which lands here)."""
    from sqlalchemy import event

    if engine.dialect.name == "sqlite" or engine in _HOOKED:
        return
    database = describe_url(engine.url.render_as_string(hide_password=True))

    @event.listens_for(engine, "do_connect")
    def _connect(dialect, conn_rec, cargs, cparams):  # noqa: ARG001 - SQLAlchemy's signature
        return ride_out(lambda: dialect.loaded_dbapi.connect(*cargs, **cparams), database=database,
                        what="connecting", role=role)

    _HOOKED.add(engine)
