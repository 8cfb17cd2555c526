"""The check a run makes before its first write: every stage it will run, against the live catalog.

`metadata validate` checks the metadata on its own; by the time a run starts, the catalog may
have moved (a table's columns changed, an upstream table was dropped) or the control DB may have
been edited with plain SQL. So a run checks all its stages at once — the same static checks
(`lakehouse.metadata.checks`), with the live schemas of the tables that exist — before any stage
writes, and stops with a `ConfigurationError` (terminal: never retried, never healed) instead of
failing midway with upstream stages already published. Reads only: PyIceberg table metadata.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from lakehouse.errors import ConfigurationError
from lakehouse.metadata.model import MetadataCatalog, Stage

if TYPE_CHECKING:
    from lakehouse.platform import Platform


def _locate(section: str, key: tuple) -> str:
    return f"control DB {section}{list(key)}"


def problems_for(catalog: MetadataCatalog, stages: list[Stage], live,
                 upstreams: Mapping[str, list[str]] | None = None) -> list[str]:
    """Every problem of `stages` as a run of exactly them would meet it, given the `live` schemas.
    `upstreams`: target id -> tables read, as apply stored them, for stages outside the run (their
    SQL is then not parsed: a run's check costs the same at one pipeline or thousands)."""
    from lakehouse.metadata.checks import check_stages
    from lakehouse.metadata.derive import stage_upstreams

    planned = {s.target_id for s in stages}
    only = {(s.pipeline_id, s.stage_name) for s in stages}
    known = {t: ups for t, ups in (upstreams or {}).items() if t not in planned}  # the run's own: parsed now
    out = [str(p) for p in check_stages(catalog, _locate, lambda _k: None, live=live, planned=planned, only=only,
                                        upstreams=known)]
    for st in stages:
        for ident in stage_upstreams(catalog, st):
            producer = catalog.target_by_identifier(ident)
            writer = catalog.stage_for_target(producer.target_id) if producer is not None else None
            if writer is None or producer.target_id in planned or live.get(ident) is not None:
                continue
            replica = catalog.source(producer.alternative_source_id) if producer.alternative_source_id else None
            if replica is not None and replica.table_identifier and live.get(replica.table_identifier) is not None:
                continue  # unavailable, but its declared replica is there: the stage reads that (lineage.recovery)
            out.append(f"{_locate('stages', st.key())}: stage {st.pipeline_id}.{st.stage_name} reads {ident}, which "
                       f"does not exist yet and is not written by this run. Fix: run stage "
                       f"{writer.pipeline_id}.{writer.stage_name} first, or in the same run")
    return out


def check_run(platform: Platform, stage_ids: list[tuple[str, str]]) -> None:
    """Raise ConfigurationError listing every problem of these (pipeline_id, stage_name) stages."""
    from lakehouse.table.catalog import LiveTables

    catalog = platform.store.load()
    stages = [catalog.stage(p, n) for p, n in stage_ids]
    problems = problems_for(catalog, stages, LiveTables(platform.pyiceberg_catalog()), stored_upstreams(platform))
    if problems:
        raise ConfigurationError(
            f"stopped before the run's first write: {len(problems)} configuration problem(s) in the stage(s) of "
            "this run (a retry would fail the same way; fix the metadata, apply it, run again):\n  - "
            + "\n  - ".join(problems))


def stored_upstreams(platform: Platform) -> dict[str, list[str]]:
    """target id -> the tables its stage reads, as apply derived them (lakehouse.metadata.derived)."""
    import json

    import sqlalchemy as sa

    from lakehouse.metadata.store import derived_stages as t

    platform.store.create_all()
    with platform.store.engine.connect() as conn:
        return {tid: json.loads(ups or "[]") for tid, ups in conn.execute(sa.select(t.c.target_id, t.c.upstream_tables))}
