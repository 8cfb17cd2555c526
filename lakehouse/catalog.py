"""PyIceberg access to the platform's Iceberg catalog (the same tables Spark's JdbcCatalog writes)."""

from __future__ import annotations

import threading

from lakehouse.settings import Settings
from lakehouse.sqlite_files import BUSY_TIMEOUT_S, prepare_sqlite

_CACHE: dict[tuple, object] = {}
_LOCK = threading.Lock()


def pyiceberg_catalog(settings: Settings):
    """A SqlCatalog with the same name and database as Spark's catalog; cached per (name, uri)."""
    from pyiceberg.catalog.sql import SqlCatalog

    user, password = settings.catalog_credentials()
    uri = settings.catalog_uri
    if user and "@" not in uri and "://" in uri and not uri.startswith("sqlite"):
        from sqlalchemy.engine import make_url

        uri = make_url(uri).set(username=user, password=password).render_as_string(hide_password=False)
    if uri.startswith("sqlite:///"):
        prepare_sqlite(uri)
        uri += ("&" if "?" in uri else "?") + f"timeout={BUSY_TIMEOUT_S}"  # wait for a writer, not 5 s
    key = (settings.catalog_name, settings.catalog_uri, settings.warehouse)
    with _LOCK:
        if key not in _CACHE:
            _CACHE[key] = SqlCatalog(settings.catalog_name, uri=uri, warehouse=settings.warehouse)
        return _CACHE[key]
