"""Rate limits (records_per_minute, bytes_per_hour) as token buckets shared by every process.

The bucket state lives in the control database (table `throttle_buckets`), and each charge is ONE
atomic `UPDATE ... RETURNING` that refills the bucket for the time elapsed, subtracts the charge
and returns the new balance. The database serialises the updates (SQLite's write lock, PostgreSQL's
row lock), so concurrent runs in different processes — or on different hosts sharing a
PostgreSQL control DB — draw from one bucket without a separate lock service.

The balance may go negative: a batch is charged after it is written (its record count is only
known then) and the writer then sleeps until the debt is paid; before the next batch every writer
waits while the bucket is in debt. Over any window the charged amount is therefore at most
`rate * window + burst + one in-flight batch per writer`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import sqlalchemy as sa

from lakehouse.metadata.model import MetadataCatalog
from lakehouse.metadata.schema import buckets
from lakehouse.metadata.store import MetadataStore
from lakehouse.runtime import retry

log = logging.getLogger(__name__)


#: metric -> (unit, seconds per threshold period)
RATE_METRICS = {"records_per_minute": ("records", 60.0), "bytes_per_hour": ("bytes", 3600.0)}
DEFAULT_BURST_SECONDS = 1.0


@dataclass(frozen=True)
class Bucket:
    key: str  # e.g. source:orders_raw/records_per_minute
    unit: str  # records | bytes
    rate_per_s: float
    capacity: float


def buckets_for(catalog: MetadataCatalog, entity_type: str, entity_id: str | None) -> list[Bucket]:
    """The rate buckets that apply to one source or target, from current metadata."""
    if entity_id is None:
        return []
    burst_s = float(catalog.setting("throttle_burst_seconds", str(DEFAULT_BURST_SECONDS)) or DEFAULT_BURST_SECONDS)
    out = []
    for th in catalog.throttles:
        if th.entity_type != entity_type or th.entity_id != entity_id or th.metric not in RATE_METRICS:
            continue
        unit, period = RATE_METRICS[th.metric]
        rate = th.threshold / period
        out.append(Bucket(f"{th.pool}/{th.metric}", unit, rate, max(rate * burst_s, 1.0)))
    return out


class TokenBuckets:
    """Charges and waits on shared buckets in the control DB."""

    def __init__(self, store: MetadataStore, clock: Callable[[], float] = time.time,
                 sleep: Callable[[float], None] = time.sleep):
        self.engine = store.engine
        self.clock = clock
        self.sleep = sleep
        from lakehouse.metadata.store import ensure_tables

        ensure_tables(self.engine)

    def _least(self, a, b):
        return sa.func.least(a, b) if self.engine.dialect.name == "postgresql" else sa.func.min(a, b)

    def _greatest(self, a, b):
        return sa.func.greatest(a, b) if self.engine.dialect.name == "postgresql" else sa.func.max(a, b)

    def charge(self, bucket: Bucket, amount: float) -> float:
        """Subtract `amount` atomically; return the balance after it (negative = debt)."""
        now = self.clock()
        t = buckets.c
        elapsed = self._greatest(sa.literal(now) - t.updated_at, 0.0)
        refilled = self._least(sa.literal(bucket.capacity), t.tokens + elapsed * sa.literal(bucket.rate_per_s))
        stmt = (
            sa.update(buckets)
            .where(t.bucket_key == bucket.key)
            .values(tokens=refilled - amount, updated_at=self._greatest(t.updated_at, now),
                    rate_per_s=bucket.rate_per_s, capacity=bucket.capacity)
            .returning(t.tokens)
        )

        def attempt() -> float:
            with self.engine.begin() as conn:
                row = conn.execute(stmt).first()
            if row is not None:
                return float(row[0])
            # first use of this bucket: it starts full, minus the charge
            with self.engine.begin() as conn:
                conn.execute(sa.insert(buckets).values(bucket_key=bucket.key, tokens=bucket.capacity - amount,
                                                       updated_at=now, rate_per_s=bucket.rate_per_s,
                                                       capacity=bucket.capacity))
            return bucket.capacity - amount

        # another process created the bucket first: update again
        return retry.call(retry.INSERT_RACE, attempt, what=f"charging throttle bucket {bucket.key}",
                          also=lambda exc: isinstance(exc, sa.exc.IntegrityError))

    def wait_time(self, bucket: Bucket, balance: float) -> float:
        return 0.0 if balance >= 0 else -balance / bucket.rate_per_s

    def wait_clear(self, bucket: Bucket) -> float:
        """Block while the bucket is in debt (charging 0 just refills and reads it)."""
        waited = 0.0
        while True:
            w = self.wait_time(bucket, self.charge(bucket, 0.0))
            if w <= 0:
                return waited
            self.sleep(w)
            waited += w

    def pay(self, bucket: Bucket, amount: float) -> float:
        """Charge `amount` and sleep until this charge's debt is paid; returns seconds slept."""
        w = self.wait_time(bucket, self.charge(bucket, amount))
        if w > 0:
            self.sleep(w)
        return w


@dataclass
class StageThrottle:
    """The rate limits of one stage: its source's buckets and its target's buckets."""

    buckets: TokenBuckets | None
    source: list[Bucket] = field(default_factory=list)
    target: list[Bucket] = field(default_factory=list)
    waited_s: float = 0.0

    @classmethod
    def for_stage(cls, store: MetadataStore, catalog: MetadataCatalog, source_id: str | None,
                  target_id: str) -> StageThrottle:
        src = buckets_for(catalog, "source", source_id)
        tgt = buckets_for(catalog, "target", target_id)
        return cls(TokenBuckets(store) if (src or tgt) else None, src, tgt)

    @property
    def active(self) -> bool:
        return self.buckets is not None

    def before_batch(self) -> None:
        if self.buckets is None:
            return
        for b in (*self.source, *self.target):
            self.waited_s += self.buckets.wait_clear(b)

    def after_batch(self, records: int, source_bytes: int, target_bytes: int) -> None:
        """Charge every bucket, then sleep once, for the largest debt among them."""
        if self.buckets is None:
            return
        wait = 0.0
        for buckets_, nbytes in ((self.source, source_bytes), (self.target, target_bytes)):
            for b in buckets_:
                amount = records if b.unit == "records" else nbytes
                wait = max(wait, self.buckets.wait_time(b, self.buckets.charge(b, amount)))
        if wait > 0:
            self.buckets.sleep(wait)
            self.waited_s += wait
