"""One schema for the control DB (lakehouse.metadata.schema), created and upgraded by Alembic.

What is proven: every control table is in the one `MetaData` whatever was imported; the Alembic
revisions at head build exactly that schema (a table or model field added without a revision
fails here, by name); a control DB created before migrations existed (tables, no
`alembic_version`) is upgraded in place with its rows kept, on SQLite and on the real PostgreSQL
server; and importing or loading the code location creates no control DB.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from lakehouse.metadata import migrate
from lakehouse.metadata.schema import metadata_obj

REPO = Path(__file__).resolve().parent.parent

#: every control table the platform uses, by the module that reads and writes it
EXPECTED_OWN_TABLES = {
    "lakehouse.metadata.store": ("audit_log", "derived_stages"),
    "lakehouse.validation.history": ("check_results",),
    "lakehouse.service.jobs": ("load_jobs",),
    "lakehouse.ops.alerts": ("alerts_table", "alert_runs", "alert_deliveries"),
    "lakehouse.throughput.ratelimit": ("buckets",),
    "lakehouse.ingest.checkpoints": ("file_checkpoints", "checkpoint_marks"),
    "lakehouse.ingest.s3": ("ingest_cursors",),
    "lakehouse.ingest.arrivals": ("arrival_requests",),
    "lakehouse.table.branches": ("kept_branches", "orphan_sweeps"),
    "lakehouse.runtime.coordination": ("run_leases", "work_claims"),
}


def _url(tmp_path, engine, request) -> str:
    if engine == "sqlite":
        return f"sqlite:///{tmp_path / 'control.db'}"
    server = request.getfixturevalue("postgres_server")
    return server.sqlalchemy_url(server.create_database())


def _diff(engine: sa.Engine) -> list:
    with engine.connect() as conn:
        return compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), metadata_obj)


def test_every_control_table_is_in_the_one_metadata():
    import importlib

    from lakehouse.metadata.model import SECTIONS
    from lakehouse.metadata.schema import TABLES

    for module, names in EXPECTED_OWN_TABLES.items():
        mod = importlib.import_module(module)
        for name in names:
            table = getattr(mod, name)
            assert table.metadata is metadata_obj, f"{module}.{name} is not in lakehouse.metadata.schema"
    assert set(SECTIONS) <= set(metadata_obj.tables)
    assert all(metadata_obj.tables[s] is TABLES[s][0] for s in SECTIONS)
    # and no module of the package keeps a MetaData of its own
    stray = [str(p.relative_to(REPO)) for p in (REPO / "lakehouse").rglob("*.py")
             if re.search(r"\bMetaData\(\)", p.read_text()) and "migrations" not in p.parts
             and p.name != "schema.py"]
    assert stray == [], f"control tables outside lakehouse.metadata.schema: {stray}"


@pytest.mark.parametrize("engine", ["sqlite", "postgresql"])
def test_migrations_at_head_build_exactly_the_schema(tmp_path, engine, request):
    """If this fails after a table or model field was added: `lakehouse metadata revision -m "..."`
    writes the revision (read it, then commit it)."""
    eng = sa.create_engine(_url(tmp_path, engine, request))
    migrate.upgrade(eng)
    assert migrate.current(eng) == migrate.head()
    assert _diff(eng) == [], "the migrations and lakehouse.metadata.schema disagree: add a revision"
    eng.dispose()


def test_the_head_read_without_alembic_is_alembics_and_an_up_to_date_db_is_not_migrated_again(tmp_path):
    """Every process opening the control DB checks it is at the newest revision; when it is, that
    check reads the scripts' revision lines and one row, without loading Alembic."""
    assert migrate.script_head() == migrate.head()
    eng = sa.create_engine(f"sqlite:///{tmp_path / 'control.db'}")
    migrate.upgrade(eng)
    migrate.forget(eng)  # a new process
    code = ("import sys; import sqlalchemy as sa; from lakehouse.metadata import migrate; "
            f"migrate.upgrade(sa.create_engine({str(eng.url)!r})); print('alembic' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    with eng.begin() as conn:  # one revision behind: the same check migrates it, with Alembic
        conn.execute(sa.text("UPDATE alembic_version SET version_num = 'dbefa67f8e56'"))
        conn.execute(sa.text("ALTER TABLE stages DROP COLUMN sql_engine"))
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"
    assert migrate.current(eng) == migrate.head() and _diff(eng) == []
    eng.dispose()


def _pre_alembic_db(url: str, tmp_path) -> sa.Engine:
    """A control DB as the code before migrations left it: every table made by `create_all` over the
    same definitions, rows in them, no alembic_version."""
    from lakehouse.metadata.loader import load_metadata
    from lakehouse.metadata.store import MetadataStore
    from tests.test_metadata import BASE, write

    store = MetadataStore(url)
    metadata_obj.create_all(store.engine)  # what MetadataStore.create_all and the modules' ensure_tables did
    migrate._done.add(f"{store.engine.url}@head")  # apply without migrating: as the old code wrote
    store.apply(load_metadata(write(tmp_path, BASE)))
    migrate.forget(store.engine)
    assert migrate.current(store.engine) is None
    return store.engine


@pytest.mark.parametrize("engine", ["sqlite", "postgresql"])
def test_a_control_db_from_before_migrations_is_upgraded_in_place(tmp_path, engine, request):
    from lakehouse.metadata.store import MetadataStore

    url = _url(tmp_path, engine, request)
    eng = _pre_alembic_db(url, tmp_path)
    with eng.begin() as conn:  # an even older release: no check_results yet, a model field's column missing
        conn.execute(sa.text("DROP TABLE check_results"))
        conn.execute(sa.text("ALTER TABLE sources DROP COLUMN lineage_columns"))
        before = conn.execute(sa.text("SELECT source_id, batch_files FROM sources")).all()

    MetadataStore(url).create_all()  # what the first use in a new process does

    assert migrate.current(eng) == migrate.head()
    assert _diff(eng) == []
    with eng.connect() as conn:
        assert conn.execute(sa.text("SELECT source_id, batch_files FROM sources")).all() == before
    assert MetadataStore(url).load().source("raw").lineage_columns is True  # NULL reads as the default
    migrate.forget(eng)
    migrate.upgrade(eng)  # a second upgrade is a no-op
    assert migrate.current(eng) == migrate.head()


@pytest.mark.slow  # a subprocess importing the code location
def test_importing_and_loading_the_definitions_creates_no_control_db(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LAKEHOUSE_", "DAGSTER_HOME"))}
    env.update({"LAKEHOUSE_HOME": str(tmp_path / "home"), "DAGSTER_HOME": str(tmp_path / "dagster"),
                "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": str(REPO)})
    code = ("import lakehouse_assets.definitions as d\n"
            "print(len(d.defs.assets_defs_by_key))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    created = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    assert created == [], f"loading the code location created {created}"
