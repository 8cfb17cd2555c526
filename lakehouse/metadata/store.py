"""The control database: metadata in relational tables (SQLite embedded, PostgreSQL by URL).

The tables are defined in lakehouse.metadata.schema and created or upgraded by Alembic
(lakehouse.metadata.migrate) on first use in a process. `apply` merges by key in a single
transaction after validating the merged result.
"""

from __future__ import annotations

import json
import logging
import typing
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa

from lakehouse.metadata.loader import LoadedMetadata, Origin, build_catalog
from lakehouse.metadata.model import SECTIONS, AuditLogEntry, ControlFlag, Entity, MetadataCatalog
from lakehouse.metadata.schema import TABLES, audit_log, derived_stages, metadata_obj  # noqa: F401 - re-exported
from lakehouse.table.sqlite_files import BUSY_TIMEOUT_S, prepare_sqlite, sqlite_path

log = logging.getLogger(__name__)


def _now() -> datetime:
    return datetime.now(UTC)


def ensure_tables(engine: sa.Engine) -> sa.Engine:
    """`engine`, with the control DB migrated to the newest revision (once per database per
    process; lakehouse.metadata.migrate)."""
    from lakehouse.metadata.migrate import upgrade

    upgrade(engine)
    return engine


@dataclass(frozen=True)
class Applied:
    """What `MetadataStore.apply_changes` did: rows per section (and `derived_stages`: stages derived
    again), and the metadata as stored before and after it."""

    counts: dict[str, int]
    before: MetadataCatalog
    after: MetadataCatalog


class MetadataStore:
    """Reads and writes the control database. Cheap to construct; engines are cached per URL."""

    _engines: dict[str, sa.Engine] = {}

    def __init__(self, url: str):
        self.url = url
        if url not in self._engines:
            if url.startswith("sqlite:///"):
                path = sqlite_path(url)
                if path is not None and path.exists():  # a missing file is created (WAL) by create_all:
                    prepare_sqlite(url)  # constructing a store to read must not create a database
                engine = sa.create_engine(url, connect_args={"timeout": BUSY_TIMEOUT_S})
            else:
                from lakehouse.runtime.outage import install_connect_hook

                engine = sa.create_engine(url, pool_pre_ping=True)
                install_connect_hook(engine, role="control DB")  # a short outage is waited out
            self._engines[url] = engine
        self.engine = self._engines[url]

    def __repr__(self) -> str:  # never print credentials embedded in a URL
        return f"MetadataStore({self.engine.url.render_as_string(hide_password=True)})"

    def create_all(self) -> None:
        """Create or upgrade the control DB's tables (Alembic, lakehouse.metadata.migrate): on first
        use in a process, never at import. A cached no-op afterwards."""
        ensure_tables(self.engine)

    def _ride_out(self, what: str, work):
        """Retry `work` through a short control DB outage (lakehouse.runtime.outage); SQLite needs none."""
        if self.engine.dialect.name == "sqlite":
            return work()
        from lakehouse.runtime.outage import describe_url, ride_out

        return ride_out(work, database=describe_url(self.engine.url.render_as_string(hide_password=True)),
                        what=what, role="control DB")

    # ------------------------------------------------------------------ read
    #: (section, row as stored) -> its validated entity. Every step of a run loads the catalog; at
    #: thousands of pipelines validating every row each time costs far more than reading them, and
    #: a row that is what it was is the entity it was (entities are never edited in place).
    _entities: dict[tuple, Entity] = {}

    @classmethod
    def entity(cls, section: str, row: typing.Mapping[str, Any]) -> Entity:
        """The entity of one row as stored (JSON fields as text), validated once per process."""
        return cls._entity(section, tuple(row.keys()), tuple(row.values()))

    @classmethod
    def _entity(cls, section: str, names: tuple[str, ...], values: tuple) -> Entity:
        memo = (section, names, values)
        hit = cls._entities.get(memo)
        if hit is None:
            _, json_cols = TABLES[section]
            d = {k: (json.loads(v) if k in json_cols else v) for k, v in zip(names, values, strict=True)
                 if v is not None}
            hit = SECTIONS[section].model_validate(d)
            if len(cls._entities) > 1_000_000:
                cls._entities.clear()
            cls._entities[memo] = hit
        return hit

    def load(self, sections: Iterable[str] | None = None) -> MetadataCatalog:
        """The catalog as stored now (every row read on every call); `sections`: only these tables.
        Also tells lakehouse.runtime.outage the window to ride out outages with, so that the last
        operational metadata read governs the next outage."""
        from lakehouse.runtime.outage import SETTING_KEY, set_window

        sections = None if sections is None else tuple(sections)
        catalog = self._ride_out("reading metadata", lambda: self._load(sections))
        if sections is None or "platform_settings" in sections:
            set_window(catalog.setting(SETTING_KEY))
        return catalog

    def _load(self, sections: Iterable[str] | None = None) -> MetadataCatalog:
        self.create_all()
        data: dict[str, list] = {}
        with self.engine.connect() as conn:
            for section in (SECTIONS if sections is None else sections):
                table, _ = TABLES[section]
                result = conn.execute(sa.select(table))
                names = tuple(result.keys())
                rows = [self._entity(section, names, tuple(r)) for r in result]
                data[section] = sorted(rows, key=lambda e: tuple(str(x) for x in e.key()))
        return MetadataCatalog(**data)

    def load_validated(self) -> LoadedMetadata:
        catalog = self.load()
        rows = {
            s: [(e, Origin("control-db", f"{s}{list(e.key())}")) for e in getattr(catalog, s)] for s in SECTIONS
        }
        return build_catalog(rows)

    # ------------------------------------------------------------------ write
    def apply(self, incoming: LoadedMetadata, *, replace: bool = False, live=None) -> dict[str, int]:
        """Merge rows by key (or replace everything) in one transaction; validate the result first
        (with `live` table schemas for the static checks, lakehouse.metadata.checks). Rows per section."""
        return self.apply_changes(incoming, replace=replace, live=live).counts

    def apply_changes(self, incoming: LoadedMetadata, *, replace: bool = False, live=None) -> Applied:
        """`apply`, also handing back the metadata as stored before and after it (which apply reads and
        builds anyway): what changed, e.g. the code locations to reload, without reading it twice more."""
        from lakehouse.metadata.derived import read_baseline, refresh

        self.create_all()
        before = self.load()
        current = MetadataCatalog() if replace else before
        baseline = None
        if not replace:  # what was applied before passed the checks: check again what this apply changes
            with self.engine.connect() as conn:
                baseline = read_baseline(conn, current)
        merged_rows: dict[str, list[tuple[Entity, Origin]]] = {}
        for section in SECTIONS:
            by_key: dict[tuple, tuple[Entity, Origin]] = {
                e.key(): (e, Origin("control-db", f"{section}{list(e.key())}")) for e in getattr(current, section)
            }
            for e in getattr(incoming.catalog, section):
                by_key[e.key()] = (e, incoming.origins.get((section, e.key()), Origin("input", section)))
            merged_rows[section] = list(by_key.values())
        # raises MetadataError naming file and key path
        merged = build_catalog(merged_rows, live=live, baseline=baseline).catalog
        counts: dict[str, int] = {}
        with self.engine.begin() as conn:
            for section, (table, json_cols) in TABLES.items():
                model = SECTIONS[section]
                if replace:
                    conn.execute(sa.delete(table))
                entities = getattr(incoming.catalog, section)
                stored = {e.key(): e for e in getattr(current, section)}
                for e in entities:
                    if stored.get(e.key()) != e:  # a row that is what it was is not written again
                        self._upsert(conn, table, json_cols, model, e)
                counts[section] = len(entities)
            # in the same transaction: the derived rows never disagree with the metadata they come from
            counts["derived_stages"] = len(refresh(conn, merged).rederived)
        return Applied(counts, before, merged)

    @staticmethod
    def _row(e: Entity, json_cols: set[str]) -> dict[str, Any]:
        d = e.model_dump(mode="json")
        if isinstance(e, ControlFlag) and d.get("updated_at") is None:
            d["updated_at"] = _now()
        elif "updated_at" in d and isinstance(d["updated_at"], str):
            d["updated_at"] = datetime.fromisoformat(d["updated_at"])
        return {k: (json.dumps(v) if k in json_cols and v is not None else v) for k, v in d.items()}

    def _upsert(self, conn: sa.Connection, table: sa.Table, json_cols: set[str], model: type[Entity], e: Entity) -> None:
        where = sa.and_(*[table.c[k] == v for k, v in zip(model.__key__, e.key(), strict=True)])
        conn.execute(sa.delete(table).where(where))
        conn.execute(sa.insert(table).values(**self._row(e, json_cols)))

    def upsert(self, entities: Iterable[Entity]) -> None:
        """Write operational rows (flags, profiles, throttles...) without re-validating the catalog."""
        self.create_all()
        section_of = {m: s for s, m in SECTIONS.items()}
        touched: set[str] = set()
        with self.engine.begin() as conn:
            for e in entities:
                section = section_of[type(e)]
                table, json_cols = TABLES[section]
                self._upsert(conn, table, json_cols, type(e), e)
                touched.add(section)
        from lakehouse.metadata.derived import INPUT_SECTIONS, refresh

        if touched & INPUT_SECTIONS:  # a stage, target, source or rule set changed: re-derive what it touches
            catalog = self.load()
            with self.engine.begin() as conn:
                refresh(conn, catalog)

    # ------------------------------------------------------------------ control flags
    def set_enabled(self, entity_type: str, entity_id: str, enabled: bool, by: str | None = None) -> None:
        self.upsert([ControlFlag(entity_type=entity_type, entity_id=entity_id, flag_value=enabled,
                                 updated_at=_now(), updated_by=by)])

    def flag(self, entity_type: str, entity_id: str, flag_name: str = "enabled") -> bool | None:
        table, _ = TABLES["control_flags"]
        self.create_all()
        with self.engine.connect() as conn:
            row = conn.execute(
                sa.select(table.c.flag_value).where(
                    table.c.entity_type == entity_type, table.c.entity_id == entity_id, table.c.flag_name == flag_name
                )
            ).first()
        return None if row is None else bool(row[0])

    def enabled(self, pipeline_id: str, stage_name: str | None = None) -> tuple[bool, str]:
        """Is this pipeline (and stage) allowed to run right now? Returns (ok, reason).

        Reads the control tables on every call: a flag flipped by CLI or plain SQL applies at once.
        """
        return self._ride_out("reading control flags", lambda: self._enabled(pipeline_id, stage_name))

    def _enabled(self, pipeline_id: str, stage_name: str | None = None) -> tuple[bool, str]:
        self.create_all()
        pipes, _ = TABLES["pipelines"]
        stages, _ = TABLES["stages"]
        with self.engine.connect() as conn:
            p = conn.execute(sa.select(pipes.c.enabled).where(pipes.c.pipeline_id == pipeline_id)).first()
            st = None
            if stage_name is not None:
                st = conn.execute(
                    sa.select(stages.c.enabled).where(
                        stages.c.pipeline_id == pipeline_id, stages.c.stage_name == stage_name
                    )
                ).first()
        if p is None:
            return False, f"pipeline {pipeline_id!r} is not in the control database"
        if self.flag("platform", "*") is False:
            return False, "the whole platform is disabled (control_flags platform/*)"
        pf = self.flag("pipeline", pipeline_id)
        if pf is False or (pf is None and not p[0]):
            return False, f"pipeline {pipeline_id!r} is disabled by control_flags"
        if stage_name is not None:
            sf = self.flag("stage", f"{pipeline_id}.{stage_name}")
            if sf is False or (sf is None and st is not None and not st[0]):
                return False, f"stage {pipeline_id}.{stage_name} is disabled by control_flags"
        return True, "enabled"

    # ------------------------------------------------------------------ audit log
    def audit(self, entry: AuditLogEntry | None = None, **fields: Any) -> None:
        e = entry or AuditLogEntry(**fields)
        self._ride_out(f"writing the audit log ({e.event})", lambda: self._audit(e))

    def _audit(self, e: AuditLogEntry) -> None:
        self.create_all()
        with self.engine.begin() as conn:
            conn.execute(
                sa.insert(audit_log).values(
                    ts=e.ts or _now(),
                    run_id=e.run_id,
                    pipeline_id=e.pipeline_id,
                    stage_name=e.stage_name,
                    dataset=e.dataset,
                    event=e.event,
                    error_class=e.error_class,
                    message=(e.message or "")[:4000] or None,
                    action=e.action,
                    outcome=e.outcome,
                    duration_ms=e.duration_ms,
                    details=json.dumps(e.details, default=str),
                )
            )

    def audit_entries(
        self,
        pipeline_id: str | None = None,
        since: datetime | None = None,
        run_id: str | None = None,
        event: str | None = None,
        limit: int = 1000,
    ) -> list[AuditLogEntry]:
        self.create_all()
        q = sa.select(audit_log).order_by(audit_log.c.id)
        if pipeline_id:
            q = q.where(audit_log.c.pipeline_id == pipeline_id)
        if since:
            q = q.where(audit_log.c.ts >= since)
        if run_id:
            q = q.where(audit_log.c.run_id == run_id)
        if event:
            q = q.where(audit_log.c.event == event)
        with self.engine.connect() as conn:
            rows = conn.execute(q.limit(limit)).mappings().all()
        return [AuditLogEntry(**{**r, "details": json.loads(r["details"] or "{}")}) for r in rows]
