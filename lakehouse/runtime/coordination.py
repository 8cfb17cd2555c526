"""Concurrent runs meeting in the control DB: run leases, work claims and the publish lock.

* **Run leases** (`run_leases`): a run working on a table holds a lease row (run key = its audit
  branch name, table, host, pid) that a thread of its process refreshes every `HEARTBEAT_S`
  while one of the run's steps on that table is running. A run is *dead* for a table when its
  lease is gone, stale (not refreshed for the lease TTL: a crashed host, or a load that waited
  longer than that for its pool slot after its extract), names a process of this host that no
  longer exists, or names this very process with no step of it running. Headless
  `lakehouse run`, the Dagster daemon's run workers and `dagster dev` all use this one rule,
  whatever Dagster instance they run on. Dead runs' branches are dropped by `lakehouse.table.branches`.
* **Claims** (`work_claims`): at plan time a run claims the input it is about to load (a file
  key + etag, a JDBC window's low watermark) with a unique key; input claimed by a live run is
  left to it, input claimed by a dead run is taken over. Concurrent runs therefore split the work
  instead of redoing it. Claims are an optimisation only: the guarantee is the check at publish
  (`lakehouse.table.publish`).
* **Publish lock**: one per table, held across the publish check and commit so that concurrent
  publishers queue instead of failing compare-and-swaps. It dies with its holder (a PostgreSQL
  session advisory lock; on the embedded SQLite control DB an `flock` on a file next to it,
  released by the kernel when the process dies). A lock not obtained within `LOCK_WAIT_S` is
  skipped (logged): correctness does not depend on it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import socket
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import sqlalchemy as sa

from lakehouse.metadata.schema import run_leases, work_claims
from lakehouse.runtime import retry

if TYPE_CHECKING:
    from lakehouse.platform import Platform
    from lakehouse.stage.core import StageContext

log = logging.getLogger(__name__)

HEARTBEAT_S = 10.0
MIN_LEASE_TTL_S = 120.0
LOCK_WAIT_S = 600.0

HOST = socket.gethostname()


def engine_for(platform: Platform) -> sa.Engine:
    from lakehouse.metadata.store import ensure_tables

    return ensure_tables(platform.store.engine)


def run_key(run_id: str) -> str:
    """The key of a run in leases and claims: its audit branch name."""
    from lakehouse.table.iceberg import branch_name_for_run

    return branch_name_for_run(run_id)


def lease_ttl_s() -> float:
    """A lease outlives an outage of the control DB that the run rides out."""
    from lakehouse.runtime.outage import window_seconds

    return max(MIN_LEASE_TTL_S, 2 * window_seconds() + 30)


# --------------------------------------------------------------------------- leases


class _Heartbeat:
    """The process's lease keeper: refreshes, every HEARTBEAT_S, the leases of the steps running."""

    def __init__(self) -> None:
        self.held: dict[tuple[str, str, str], sa.Engine] = {}  # (engine url, run_key, table) -> engine
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None

    def add(self, engine: sa.Engine, key: str, table: str) -> None:
        with self.lock:
            self.held[(str(engine.url), key, table)] = engine
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._loop, name="lakehouse-lease-heartbeat", daemon=True)
                self.thread.start()

    def remove(self, engine: sa.Engine, key: str, table: str) -> None:
        with self.lock:
            self.held.pop((str(engine.url), key, table), None)

    def holds(self, engine: sa.Engine, key: str, table: str) -> bool:
        return (str(engine.url), key, table) in self.held

    def _loop(self) -> None:
        while True:
            time.sleep(HEARTBEAT_S)
            with self.lock:
                items = list(self.held.items())
            by_engine: dict[str, tuple[sa.Engine, list]] = {}
            for (url, key, table), eng in items:
                by_engine.setdefault(url, (eng, []))[1].append((key, table))
            for eng, pairs in by_engine.values():
                try:
                    with eng.begin() as conn:
                        for key, table in pairs:
                            conn.execute(sa.update(run_leases).where(
                                run_leases.c.run_key == key, run_leases.c.table_ident == table,
                            ).values(heartbeat_at=time.time()))
                except Exception:  # noqa: BLE001 - an outage: the next beat tries again
                    log.warning("lease heartbeat failed (control DB unreachable?)", exc_info=True)


_HEARTBEAT = _Heartbeat()


def hold_lease(platform: Platform, run_id: str, table: str) -> None:
    """Take (or refresh) this run's lease on `table`: a step of the run is working on it, and the
    process keeps the lease fresh until `end_step` or `release_lease`."""
    eng = engine_for(platform)
    key, now = run_key(run_id), time.time()
    with eng.begin() as conn:
        conn.execute(sa.delete(run_leases).where(run_leases.c.run_key == key, run_leases.c.table_ident == table))
        conn.execute(sa.insert(run_leases).values(run_key=key, table_ident=table, run_id=run_id[:128], host=HOST,
                                                  pid=os.getpid(), started_at=now, heartbeat_at=now))
    _HEARTBEAT.add(eng, key, table)


def end_step(platform: Platform, run_id: str, table: str) -> None:
    """A step ended but the run goes on (extract -> load): the lease stays, no longer refreshed,
    so its claims hold for the lease TTL while the load waits to start."""
    _HEARTBEAT.remove(engine_for(platform), run_key(run_id), table)


def release_lease(platform: Platform, run_id: str, table: str) -> None:
    """The run is done with `table`: drop its lease and any claims it still holds there."""
    eng = engine_for(platform)
    key = run_key(run_id)
    _HEARTBEAT.remove(eng, key, table)
    with eng.begin() as conn:
        conn.execute(sa.delete(work_claims).where(work_claims.c.run_key == key, work_claims.c.table_ident == table))
        conn.execute(sa.delete(run_leases).where(run_leases.c.run_key == key, run_leases.c.table_ident == table))


def pid_alive(pid: int) -> bool:
    """Is a process with this pid running on this host (one we may not signal counts as alive)?"""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass(frozen=True)
class Lease:
    run_key: str
    table: str
    run_id: str | None
    host: str | None
    pid: int | None
    heartbeat_at: float
    started_at: float = 0.0  # when the run took it (before its first write on the table)

    def alive(self, engine: sa.Engine, now: float | None = None) -> bool:
        if _HEARTBEAT.holds(engine, self.run_key, self.table):
            return True  # a step of it is running in this process
        if self.host == HOST and self.pid is not None:
            if self.pid == os.getpid() or not pid_alive(self.pid):
                return False  # no step of it runs in this process any more / the process is gone
        return ((now or time.time()) - self.heartbeat_at) < lease_ttl_s()


def leases(platform: Platform, table: str) -> dict[str, Lease]:
    """run_key -> lease for every run holding a lease on `table`."""
    eng = engine_for(platform)
    with eng.connect() as conn:
        rows = conn.execute(sa.select(run_leases).where(run_leases.c.table_ident == table)).mappings().all()
    return {r["run_key"]: Lease(r["run_key"], r["table_ident"], r["run_id"], r["host"], r["pid"],
                                float(r["heartbeat_at"]), float(r["started_at"])) for r in rows}


def live_runs(platform: Platform, table: str) -> set[str]:
    eng = engine_for(platform)
    now = time.time()
    return {k for k, lease in leases(platform, table).items() if lease.alive(eng, now)}


def forget_dead_leases(platform: Platform, table: str) -> list[str]:
    """Delete dead runs' leases (and their claims) on `table`; returns their run keys."""
    eng = engine_for(platform)
    now = time.time()
    dead = [k for k, lease in leases(platform, table).items() if not lease.alive(eng, now)]
    if dead:
        with eng.begin() as conn:
            conn.execute(sa.delete(work_claims).where(work_claims.c.table_ident == table,
                                                      work_claims.c.run_key.in_(dead)))
            conn.execute(sa.delete(run_leases).where(run_leases.c.table_ident == table,
                                                     run_leases.c.run_key.in_(dead)))
    return dead


# --------------------------------------------------------------------------- claims


@dataclass
class ClaimResult:
    mine: list[tuple[str, str]]
    taken: dict[str, list[tuple[str, str]]]  # run_key of a live run -> what it holds

    def taken_count(self) -> int:
        return sum(len(v) for v in self.taken.values())

    def message(self) -> str:
        return "; ".join(f"{len(v)} item(s) being loaded by run {k}" for k, v in sorted(self.taken.items()))


def claim(platform: Platform, table: str, run_id: str, items: Iterable[tuple[str, str]]) -> ClaimResult:
    """Claim (work_key, version) items for this run on `table`: free ones and those of dead runs
    become ours, those of live runs are reported as taken. Atomic per item (a unique key); a run that
    inserted one of them first makes this one read again (the named policy `retry.INSERT_RACE`)."""
    eng = engine_for(platform)
    key = run_key(run_id)
    wanted = list(dict.fromkeys(items))
    t = work_claims

    def attempt() -> ClaimResult:
        existing: dict[tuple[str, str], str] = {}
        with eng.connect() as conn:
            for chunk in _chunks(sorted({w for w, _ in wanted}), 400):
                for w, v, holder in conn.execute(sa.select(t.c.work_key, t.c.version, t.c.run_key).where(
                        t.c.table_ident == table, t.c.work_key.in_(chunk))):
                    existing[(w, v)] = holder
        holders = leases(platform, table)
        now = time.time()
        alive = {h for h in set(existing.values()) if h in holders and holders[h].alive(eng, now)} | {key}
        mine, taken, free, stale = [], {}, [], []
        for item in wanted:
            holder = existing.get(item)
            if holder is None:
                free.append(item)
            elif holder == key:
                mine.append(item)
            elif holder in alive:
                taken.setdefault(holder, []).append(item)
            else:
                stale.append((item, holder))
        with eng.begin() as conn:
            if free:
                conn.execute(sa.insert(t), [{"table_ident": table, "work_key": w, "version": v, "run_key": key,
                                             "claimed_at": now} for w, v in free])
            for (w, v), holder in stale:  # take over a dead run's claim, unless someone was faster
                res = conn.execute(sa.update(t).where(t.c.table_ident == table, t.c.work_key == w,
                                                      t.c.version == v, t.c.run_key == holder)
                                   .values(run_key=key, claimed_at=now))
                if res.rowcount == 1:
                    mine.append((w, v))
        mine += free
        order = {item: i for i, item in enumerate(wanted)}
        return ClaimResult(sorted(mine, key=order.__getitem__), taken)

    # another run inserted one of them first: read again
    return retry.call(retry.INSERT_RACE, attempt, what=f"claiming {len(wanted)} item(s) of {table}",
                      also=lambda exc: isinstance(exc, sa.exc.IntegrityError))


CLAIMS_SETTING = "claims.enabled"


def claims_enabled(catalog) -> bool:
    """Claims at plan time are on unless the platform setting `claims.enabled` says false."""
    return str(catalog.setting(CLAIMS_SETTING, "true")).strip().lower() not in ("false", "0", "no", "off")


def claim_files(platform: Platform, table: str, run_id: str, files: list) -> tuple[list, ClaimResult]:
    """(the files of `files` this run now holds, the claim result naming what live runs hold)."""
    res = claim(platform, table, run_id, [(f.key, f.etag) for f in files])
    mine = set(res.mine)
    return [f for f in files if (f.key, f.etag) in mine], res


def claim_new_files(ctx: StageContext, new: list) -> tuple[list, str]:
    """(the new files this step claimed, what live runs are loading instead) for a file source."""
    if not new or not claims_enabled(ctx.catalog):
        return new, ""
    mine, res = claim_files(ctx.platform, ctx.target.identifier, ctx.run_id, new)
    if res.taken:
        ctx.audit("files_claimed_elsewhere", outcome="skipped", message=res.message(),
                  details={"by_run": {k: len(v) for k, v in res.taken.items()}})
    return mine, res.message()


def keep_claims(ctx: StageContext, picked: list, mine: list) -> list:
    """Give back the claims on files this step will not load after all (per-run caps)."""
    rest = [(f.key, f.etag) for f in mine if f not in set(picked)]
    if rest:
        release_claims(ctx.platform, ctx.target.identifier, ctx.run_id, rest)
    return picked


def release_claims(platform: Platform, table: str, run_id: str, items: Iterable[tuple[str, str]] | None = None) -> None:
    eng = engine_for(platform)
    t = work_claims
    cond = [t.c.table_ident == table, t.c.run_key == run_key(run_id)]
    with eng.begin() as conn:
        if items is None:
            conn.execute(sa.delete(t).where(*cond))
            return
        for w, v in items:
            conn.execute(sa.delete(t).where(*cond, t.c.work_key == w, t.c.version == v))


def _chunks(seq: list, n: int):
    for i in range(0, len(seq), n):
        yield seq[i: i + n]


# --------------------------------------------------------------------------- publish lock


def _lock_key(platform: Platform, table: str) -> int:
    digest = hashlib.sha256(f"lakehouse.publish|{platform.settings.catalog_name}|{table.lower()}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


@contextlib.contextmanager
def publish_lock(platform: Platform, table: str, wait_s: float = LOCK_WAIT_S) -> Iterator[bool]:
    """Hold the table's publish lock (yields True), or go on without it after `wait_s` (False)."""
    from lakehouse.table.iceberg import _publish_lock

    with _publish_lock(platform.settings.catalog_name, table):  # threads of this process first
        eng = platform.store.engine
        if eng.dialect.name == "postgresql":
            with _pg_advisory_lock(eng, _lock_key(platform, table), wait_s, table) as got:
                yield got
        elif eng.dialect.name == "sqlite" and eng.url.database not in (None, "", ":memory:"):
            with _file_lock(os.path.join(os.path.dirname(os.path.abspath(eng.url.database)), ".publish-locks",
                                         f"{_lock_key(platform, table) & 0xFFFFFFFFFFFF:012x}.lock"), wait_s, table) as got:
                yield got
        else:
            yield False


@contextlib.contextmanager
def _pg_advisory_lock(engine: sa.Engine, key: int, wait_s: float, table: str) -> Iterator[bool]:
    conn = None
    got = False
    try:
        conn = engine.connect()
        deadline = time.monotonic() + wait_s
        while True:
            got = bool(conn.execute(sa.text("SELECT pg_try_advisory_lock(:k)"), {"k": key}).scalar())
            conn.commit()
            if got or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    except Exception as exc:  # noqa: BLE001 - the lock only saves work: publish safely without it
        log.warning("publish lock for %s unavailable (%s); publishing without it", table, str(exc)[:200])
    if not got:
        log.warning("publish lock for %s not obtained; the publish check alone guards it", table)
    try:
        yield got
    finally:
        if conn is not None:
            with contextlib.suppress(Exception):
                if got:
                    conn.execute(sa.text("SELECT pg_advisory_unlock(:k)"), {"k": key})
                    conn.commit()
            with contextlib.suppress(Exception):
                conn.close()


@contextlib.contextmanager
def _file_lock(path: str, wait_s: float, table: str) -> Iterator[bool]:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    got = False
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                got = True
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    log.warning("publish lock for %s not obtained in %ss; the publish check alone guards it",
                                table, wait_s)
                    break
                time.sleep(0.05)
        yield got
    finally:
        if got:
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
