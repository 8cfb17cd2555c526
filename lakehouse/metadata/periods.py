"""The periods of a time-partitioned target (`time_partition.granularity`: day, hour or month).

A period is the value the target's partition column holds for it, and the Dagster partition key
names it in the key format of Dagster's partitions definition of that granularity (what the UI and
a backfill's run tags carry):

| granularity | column value | Dagster key | definition |
|---|---|---|---|
| day | the date | `2026-11-02` | DailyPartitionsDefinition |
| hour | the UTC timestamp the hour starts at | `2026-11-02-05:00` | HourlyPartitionsDefinition |
| month | the date of its first day | `2026-11-01` | MonthlyPartitionsDefinition |

Hours are timezone-aware UTC datetimes here, so Spark literals of them mean the same instant
whatever the process's local time zone.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

GRANULARITIES = ("day", "hour", "month")
ADJECTIVE = {"day": "daily", "hour": "hourly", "month": "monthly"}
KEY_FORMAT = {"day": "%Y-%m-%d", "hour": "%Y-%m-%d-%H:%M", "month": "%Y-%m-%d"}
#: what `lakehouse backfill --from/--to` accepts besides the key itself
INPUT_FORMATS = {"day": ("%Y-%m-%d",),
                 "hour": ("%Y-%m-%d-%H:%M", "%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M", "%Y-%m-%dT%H", "%Y-%m-%d %H"),
                 "month": ("%Y-%m", "%Y-%m-%d")}
EXAMPLE = {"day": "2026-11-02", "hour": "2026-11-02T05 or 2026-11-02-05:00", "month": "2026-11"}

Period = date | datetime


def first(granularity: str, start_date: date) -> Period:
    """The first period of a target whose time_partition starts on `start_date`."""
    return datetime(start_date.year, start_date.month, start_date.day, tzinfo=UTC) if granularity == "hour" \
        else start_date


def key(granularity: str, period: Period) -> str:
    return period.strftime(KEY_FORMAT[granularity])


def parse(granularity: str, text: str) -> Period:
    """A period from its key or an accepted input; ValueError saying what is accepted."""
    for fmt in INPUT_FORMATS[granularity]:
        try:
            at = datetime.strptime(text.strip(), fmt)
        except ValueError:
            continue
        if granularity == "hour":
            return at.replace(tzinfo=UTC)
        if granularity == "month" and at.day != 1:
            raise ValueError(f"{text!r} is not the first day of a month: a month is YYYY-MM (e.g. 2026-11)")
        return at.date()
    raise ValueError(f"{text!r} is not a{'n' if granularity == 'hour' else ''} {granularity} "
                     f"(e.g. {EXAMPLE[granularity]})")


def following(granularity: str, period: Period) -> Period:
    if granularity == "day":
        return period + timedelta(days=1)
    if granularity == "hour":
        return period + timedelta(hours=1)
    return period.replace(year=period.year + period.month // 12, month=period.month % 12 + 1)


def periods(granularity: str, start: Period, end: Period) -> list[Period]:
    """start..end, both included."""
    out = []
    while start <= end:
        out.append(start)
        start = following(granularity, start)
    return out
