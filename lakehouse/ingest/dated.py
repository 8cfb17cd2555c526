"""Dated landings (seed 003): one day's prefix ingested on demand, Hive-style path values as columns.

A file source (kind files or s3) may declare

* `dated_layout`: where one day's files are, relative to its `path` / `prefix`, as a template of
  `{yyyy}`, `{mm}` and `{dd}` (e.g. `year={yyyy}/month={mm}/day={dd}` or `dt={yyyy}-{mm}-{dd}`).
  A run carrying the run tag `lakehouse/ingest_date` (`lakehouse ingest SOURCE --date 2025-12-29`)
  plans only the files under that day's prefix; the file checkpoints make it exactly once (a second
  run of the same day plans nothing; other days' files stay unplanned until asked for, or until an
  undated run takes whatever is new).
* `path_columns`: `[{name: year, type: int}, ...]`: the value of each `name=value` segment of a file's
  key becomes a typed column of its rows (int, bigint, string or date), on both engines. A file whose
  key has no such segment gets null.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lakehouse.metadata.model import Source
    from lakehouse.stage.core import FileRef

DATE_TAG = "lakehouse/ingest_date"
PATH_COLUMN_TYPES = ("int", "bigint", "string", "date")


def parse_date(value: str) -> dt.date:
    try:
        return dt.date.fromisoformat(value)
    except ValueError:
        raise ValueError(f"--date {value!r} is not a day YYYY-MM-DD") from None


def day_prefix(source: Source, day: dt.date) -> str:
    """The day's directory under the source's root, as a key prefix ending in '/'."""
    rendered = (source.dated_layout or "").replace("{yyyy}", f"{day.year:04d}") \
        .replace("{mm}", f"{day.month:02d}").replace("{dd}", f"{day.day:02d}")
    return rendered.strip("/") + "/"


def s3_day_prefix(source: Source, day: dt.date) -> str:
    """The day's full S3 key prefix (the source's prefix taken as a directory)."""
    root = source.prefix.strip("/")
    return (root + "/" if root else "") + day_prefix(source, day)


def key_in_day(source: Source, key: str, day: dt.date) -> bool:
    """Whether a file key (relative to a files source's root, or a full S3 key) lies in that day."""
    if source.kind == "s3":
        return key.lstrip("/").startswith(s3_day_prefix(source, day))
    return key.lstrip("/").startswith(day_prefix(source, day))


def requested_day(source: Source, run_tags: dict[str, str]) -> dt.date | None:
    """The day a run asks for (None: an undated run); a dated run of an undated source is refused."""
    value = run_tags.get(DATE_TAG)
    if not value:
        return None
    if not source.dated_layout:
        raise ValueError(f"source {source.source_id!r} has no dated_layout: a run for one day "
                         f"({DATE_TAG}={value}) cannot name its files")
    return parse_date(value)


def only_day(source: Source, files: list[FileRef], run_tags: dict[str, str]) -> list[FileRef]:
    """`files` kept to the run's requested day (all of them for an undated run)."""
    day = requested_day(source, run_tags)
    return files if day is None else [f for f in files if key_in_day(source, f.key, day)]


def segment_pattern(name: str) -> str:
    """A regex whose group 1 is the value of the last `name=value` directory segment of a path."""
    return rf"^(?:.*/)?{re.escape(name)}=([^/]*)/"


def path_value(key: str, name: str) -> str | None:
    m = re.match(segment_pattern(name), key)
    return m.group(1) if m and m.group(1) != "" else None


def typed_value(value: str | None, type_: str) -> int | str | dt.date | None:
    """A path value as its declared type (None when absent or not of that type, as Spark's cast)."""
    if value is None:
        return None
    try:
        if type_ in ("int", "bigint"):
            return int(value)
        if type_ == "date":
            return dt.date.fromisoformat(value)
    except ValueError:
        return None
    return value
