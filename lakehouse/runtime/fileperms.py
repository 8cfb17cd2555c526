"""Files and directories the platform creates are owner-only by default (0600 / 0700).

The control DB, the Iceberg catalog and warehouse, staged downloads and quarantined copies hold
the data itself, so nobody else on the machine should read them. The platform sets the process
umask (inherited by the Spark JVM it starts) and Hadoop's own `fs.permissions.umask-mode`, which
Hadoop applies explicitly to every file it writes. `LAKEHOUSE_UMASK` (octal, default 077) changes
it, e.g. `LAKEHOUSE_UMASK=027` to let the owner's group read.
"""

from __future__ import annotations

import os

DEFAULT_UMASK = 0o077
ENV = "LAKEHOUSE_UMASK"


def configured_umask(raw: str | None = None) -> int:
    """The umask `raw` spells (the settings' `umask`); None: the environment's, through the settings
    model (a process that has no settings object at hand: creating a SQLite file)."""
    if raw is None:
        from lakehouse.settings import PathSettings, current

        raw = current(PathSettings).umask
    raw = (raw or "").strip()
    if not raw:
        return DEFAULT_UMASK
    try:
        value = int(raw, 8)
    except ValueError:
        raise ValueError(f"{ENV}={raw!r} is not an octal umask such as 077 or 027") from None
    if not 0 <= value <= 0o777:
        raise ValueError(f"{ENV}={raw!r} is not an octal umask between 000 and 777")
    return value


def apply_umask(raw: str | None = None) -> int:
    """Set the process umask (idempotent; every file created afterwards follows it)."""
    mask = configured_umask(raw)
    os.umask(mask)
    return mask


def file_mode(raw: str | None = None) -> int:
    return 0o666 & ~configured_umask(raw)


def hadoop_umask(raw: str | None = None) -> str:
    """For `spark.hadoop.fs.permissions.umask-mode`: Hadoop chmods what it writes to 0666/0777 minus this."""
    return f"{configured_umask(raw):03o}"
