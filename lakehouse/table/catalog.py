"""PyIceberg access to the platform's Iceberg catalog (the same tables Spark's JdbcCatalog writes)."""

from __future__ import annotations

import logging
import threading

from lakehouse.settings import Settings
from lakehouse.table.sqlite_files import BUSY_TIMEOUT_S, prepare_sqlite, sqlite_path

log = logging.getLogger(__name__)
_CACHE: dict[tuple, object] = {}
_LOCK = threading.Lock()


def _uri(settings: Settings) -> str:
    """The catalog's SQLAlchemy URL with the credentials from the environment (never from the URL)."""
    user, password = settings.catalog_credentials()
    uri = settings.catalog_uri
    if user and "@" not in uri and "://" in uri and not uri.startswith("sqlite"):
        from sqlalchemy.engine import make_url

        uri = make_url(uri).set(username=user, password=password).render_as_string(hide_password=False)
    return uri


_METADATA_CACHE_TABLES = 1024
#: the tables' FileIO: a local warehouse's metadata without importing pyarrow.dataset and pandas
#: (a Spark run's driver reads only metadata), PyArrow's for data files and S3 (lakehouse.table.fileio)
FILE_IO = {"py-io-impl": "lakehouse.table.fileio.LocalMetadataFileIO"}
_CATALOG_CLASS: type | None = None


def _sql_catalog_class() -> type:
    """SqlCatalog that keeps each table's current metadata, parsed, for the next load.

    Every `load_table` still asks the catalog database for the table's current metadata location
    (so a concurrent writer's commit is seen as before); only when that location is the one held
    is the file not read and parsed again. Iceberg never rewrites a metadata file in place: a
    commit writes a new file and moves the pointer, so a location names one content for good. A run
    loads the same few tables dozens of times between its own commits (refs before and after each
    write, existence checks, snapshot summaries). One entry per table (its latest location), so
    a long-lived process holds no history of metadata versions. Public API only: `load_table` asks
    for the location itself (one query of `iceberg_tables`, the row PyIceberg's own load reads) and
    leaves a location it does not hold to PyIceberg's `load_table` (then two queries)."""
    global _CATALOG_CLASS
    if _CATALOG_CLASS is not None:
        return _CATALOG_CLASS
    from collections import OrderedDict

    from pyiceberg.catalog import Catalog
    from pyiceberg.catalog.sql import IcebergTables, SqlCatalog
    from pyiceberg.io import load_file_io
    from pyiceberg.table import Table

    class MetadataCachingSqlCatalog(SqlCatalog):
        def __init__(self, name: str, **properties: str):
            super().__init__(name, **properties)
            # (namespace, table) -> (metadata location, its parsed TableMetadata)
            self._current: OrderedDict[tuple[str, str], tuple[str, object]] = OrderedDict()
            self._current_lock = threading.Lock()

        def _remember(self, key: tuple[str, str], location: str, metadata) -> None:
            with self._current_lock:
                self._current[key] = (location, metadata)
                self._current.move_to_end(key)
                while len(self._current) > _METADATA_CACHE_TABLES:
                    self._current.popitem(last=False)

        def load_table_from_storage(self, identifier) -> Table:
            """`load_table` reading the metadata file even when it is the one held: a probe of
            whether the table is available must see a storage outage (its files gone or
            unreadable), which the held copy would hide."""
            with self._current_lock:
                self._current.pop(self._key(Catalog.identifier_to_tuple(identifier)), None)
            return self.load_table(identifier)

        def commit_table(self, table, requirements, updates):
            # this process wrote the new file: its metadata is known without reading it back
            response = super().commit_table(table, requirements, updates)
            self._remember(self._key(table.name()), response.metadata_location, response.metadata)
            return response

        @staticmethod
        def _key(ident: tuple[str, ...]) -> tuple[str, str]:
            """(namespace, table) as the catalog database's row names them, the cache's key."""
            return Catalog.namespace_to_string(ident[:-1]), ident[-1]

        def _metadata_location(self, key: tuple[str, str]) -> str | None:
            """The table's current metadata location, as the catalog database's row has it."""
            from sqlalchemy import select
            from sqlalchemy.orm import Session

            with Session(self.engine) as session:
                return session.scalar(select(IcebergTables.metadata_location).where(
                    IcebergTables.catalog_name == self.name, IcebergTables.table_namespace == key[0],
                    IcebergTables.table_name == key[1]))

        def load_table(self, identifier) -> Table:
            ident = Catalog.identifier_to_tuple(identifier)
            key = self._key(ident)
            with self._current_lock:
                held = self._current.get(key)
            if held is not None and (location := self._metadata_location(key)) == held[0]:
                metadata = held[1]
                return Table(identifier=ident, metadata=metadata, metadata_location=location,
                             io=load_file_io({**self.properties, **metadata.properties}, location), catalog=self)
            table = super().load_table(identifier)  # reads the file; raises as PyIceberg does
            self._remember(key, table.metadata_location, table.metadata)
            return table

    _CATALOG_CLASS = MetadataCachingSqlCatalog
    return _CATALOG_CLASS


def pyiceberg_catalog(settings: Settings):
    """A SqlCatalog with the same name and database as Spark's catalog; cached per (name, uri)."""
    uri = _uri(settings)
    if uri.startswith("sqlite:///"):
        prepare_sqlite(uri)
        uri += ("&" if "?" in uri else "?") + f"timeout={BUSY_TIMEOUT_S}"  # wait for a writer, not 5 s
    key = (settings.catalog_name, settings.catalog_uri, settings.warehouse)
    with _LOCK:
        if key not in _CACHE:
            _CACHE[key] = _open(settings, uri)
        return _CACHE[key]


def _open(settings: Settings, uri: str):
    """Open the SQL catalog; ride out an outage of its database, and a concurrent first start
    (two processes creating `iceberg_tables` at once: the loser sees "already exists")."""
    from lakehouse.errors import already_exists
    from lakehouse.runtime import retry
    from lakehouse.runtime.outage import describe_url, install_connect_hook, ride_out

    def attempt():
        return retry.call(retry.CREATE_RACE,
                          lambda: _sql_catalog_class()(settings.catalog_name, uri=uri,
                                                       warehouse=settings.warehouse, pool_pre_ping="true",
                                                       **FILE_IO),
                          what="creating the Iceberg catalog's tables", also=already_exists)

    cat = ride_out(attempt, database=describe_url(settings.catalog_uri), what="opening the Iceberg catalog",
                   role="Iceberg catalog")
    install_connect_hook(cat.engine, role="Iceberg catalog")
    return cat


def ensure_namespace(cat, namespace: str) -> None:
    """Create `namespace` in a PyIceberg catalog unless it exists. PyIceberg checks, then inserts:
    of two processes doing it at once the loser gets a unique-constraint error, not
    NamespaceAlreadyExistsError, and the namespace is there all the same."""
    from pyiceberg.exceptions import NamespaceAlreadyExistsError

    try:
        cat.create_namespace(namespace)
    except NamespaceAlreadyExistsError:
        pass
    except Exception:
        if not cat.namespace_exists(namespace):
            raise


def readonly_catalog(settings: Settings):
    """The catalog opened for reading only, or None when there is none yet.

    `metadata validate` must not write anything: an embedded catalog file that does not exist is
    not created (None), an existing one is opened with SQLite's read-only mode, and PyIceberg is
    told not to create its tables."""
    from pyiceberg.catalog.sql import SqlCatalog

    uri = _uri(settings)
    path = sqlite_path(uri)
    if path is not None:
        if not path.is_file():
            return None
        # a WAL database read even read-only creates its -wal/-shm files unless they exist (a writer
        # is using it) or the file is opened as immutable (safe then: no WAL holds newer commits)
        in_use = path.with_name(path.name + "-wal").exists()
        uri = f"sqlite:///file:{path}?mode=ro&uri=true" + ("" if in_use else "&immutable=1")
    try:
        return SqlCatalog(settings.catalog_name, uri=uri, warehouse=settings.warehouse, init_catalog_tables="false",
                          **FILE_IO)
    except Exception as exc:  # noqa: BLE001 - no live catalog: the checks use the metadata alone
        log.warning("Iceberg catalog not readable (%s); checking against the metadata only", exc)
        return None


_SPARK_NAMES = {"long": "bigint", "integer": "int", "timestamptz": "timestamp", "timestamp_ns": "timestamp",
                "timestamptz_ns": "timestamp", "uuid": "string", "fixed": "binary"}


def spark_type(iceberg_type) -> str:
    """An Iceberg type as Spark SQL names it (struct<a:int>, array<string>, decimal(10,2) …)."""
    from pyiceberg.types import ListType, MapType, StructType

    if isinstance(iceberg_type, StructType):
        return "struct<" + ",".join(f"{f.name}:{spark_type(f.field_type)}" for f in iceberg_type.fields) + ">"
    if isinstance(iceberg_type, ListType):
        return f"array<{spark_type(iceberg_type.element_type)}>"
    if isinstance(iceberg_type, MapType):
        return f"map<{spark_type(iceberg_type.key_type)},{spark_type(iceberg_type.value_type)}>"
    text = str(iceberg_type).lower().replace(" ", "")
    return _SPARK_NAMES.get(text.split("[", 1)[0], text)


class LiveTables:
    """{identifier: {column: Spark type}} of the tables that exist now, read on first use (the
    `live` argument of lakehouse.metadata.derive / checks). A table that does not exist, or cannot
    be read, is None: the checks then fall back to what the metadata says."""

    def __init__(self, catalog):
        self.catalog = catalog
        self._cache: dict[str, dict[str, str] | None] = {}

    def get(self, identifier: str, default=None):
        ident = identifier.lower()
        if ident not in self._cache:
            self._cache[ident] = self._load(ident)
        found = self._cache[ident]
        return default if found is None else found

    def _load(self, ident: str) -> dict[str, str] | None:
        from pyiceberg.exceptions import NoSuchTableError

        if self.catalog is None or "." not in ident:
            return None
        try:
            schema = self.catalog.load_table(ident).schema()
        except NoSuchTableError:
            return None
        except Exception as exc:  # noqa: BLE001 - unreadable now: check against the metadata instead
            if "no such table" in str(exc):  # a catalog database no table was ever created in
                return None
            log.warning("cannot read the schema of %s (%s); checking it against the metadata only", ident, exc)
            return None
        return {f.name: spark_type(f.field_type) for f in schema.fields}
