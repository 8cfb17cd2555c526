"""The periods (days, hours, months) of a time-partitioned target that one run's publish wrote.

A time-partitioned target (metadata `time_partition`) is identity-partitioned by its period column,
so every data or delete file a commit adds or removes belongs to exactly one period: the manifest
entries a run's commits added or deleted name the periods they touched. Read from Iceberg's
metadata through PyIceberg: no data file is opened and no JVM is needed, whichever engine wrote
the table.

The Dagster layer records one materialization per period returned here (the Partitions tab shows
what exists), and `lakehouse backfill` records the ones it rewrote.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, date, datetime
from typing import Any

from lakehouse.metadata import periods

#: manifest entry status: 0 existing, 1 added, 2 deleted
_ADDED, _DELETED = 1, 2


def _period(granularity: str, value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        at = value if value.tzinfo is None else value.astimezone(UTC)
        return periods.key(granularity, at)
    if isinstance(value, date):
        return periods.key(granularity, value)
    return None


def _touched(table: Any, snapshot_id: int, column: str) -> Iterator[Any]:
    """The period column's partition values of the files `snapshot_id` added or deleted."""
    entries = table.inspect.entries(snapshot_id=snapshot_id)
    for e in entries.select(["status", "snapshot_id", "data_file"]).to_pylist():
        if e["snapshot_id"] == snapshot_id and e["status"] in (_ADDED, _DELETED):
            yield (e["data_file"].get("partition") or {}).get(column)


def written_periods(catalog: Any, target: Any, snapshot_ids: list[int | None]) -> list[str]:
    """The Dagster partition keys of the periods the commits `snapshot_ids` (a run's writes, on main
    once published: a fast-forward keeps their ids) added or removed files of, sorted; [] for a
    target without time partitions. Periods before the first partition are left out (Dagster's
    partitions definition has no key for them)."""
    tp = target.time_partition
    snaps = [s for s in snapshot_ids if s is not None]
    if tp is None or not snaps or not catalog.table_exists(target.identifier):
        return []
    table = catalog.load_table(target.identifier)
    first = periods.key(tp.granularity, periods.first(tp.granularity, tp.start_date))
    keys: set[str] = set()
    for snap in snaps:
        if table.metadata.snapshot_by_id(snap) is None:  # expired meanwhile
            continue
        for value in _touched(table, snap, tp.column):
            k = _period(tp.granularity, value)
            if k is not None and k >= first:
                keys.add(k)
    return sorted(keys)


def window_keys(granularity: str, first: str, last: str) -> list[str]:
    """The partition keys first..last (included) of a granularity: the periods a backfill rewrote."""
    return [periods.key(granularity, p) for p in
            periods.periods(granularity, periods.parse(granularity, first), periods.parse(granularity, last))]
