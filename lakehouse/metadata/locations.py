"""Code locations: which Dagster code location serves which pipeline (`Pipeline.code_location`).

One code location holding 1,000 pipelines makes every reload rebuild and re-send all of them
(issue 22); several locations let a reload after `metadata apply` rebuild only the one that
changed. This module answers the questions the CLI asks about them: which locations the control
DB has, which ones an apply touched, and the workspace.yaml that names them. It writes nothing
but the workspace file it is asked for, and imports nothing from the Dagster layer.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import sqlalchemy as sa
import yaml

from lakehouse.metadata.derived import STRUCTURE_SECTIONS
from lakehouse.metadata.model import DEFAULT_CODE_LOCATION, MetadataCatalog
from lakehouse.metadata.schema import TABLES

#: the module every location loads, and the attribute prefix naming one (lakehouse_assets/definitions.py)
DEFINITIONS_MODULE = "lakehouse_assets.definitions"
ATTRIBUTE_PREFIX = "location__"


def code_locations(store) -> dict[str, int]:
    """{code location: number of pipelines it serves}, read from the control DB's pipelines table;
    the default location always (it also serves what is not per pipeline)."""
    table = TABLES["pipelines"][0]
    out = {DEFAULT_CODE_LOCATION: 0}
    with store.engine.connect() as conn:
        if not sa.inspect(conn).has_table(table.name):
            return out
        have = {c["name"] for c in sa.inspect(conn).get_columns(table.name)}
        if "code_location" not in have:  # a control DB not yet upgraded: one location
            out[DEFAULT_CODE_LOCATION] = conn.execute(sa.select(sa.func.count()).select_from(table)).scalar_one()
            return out
        for loc, n in conn.execute(sa.select(table.c.code_location, sa.func.count()).group_by(table.c.code_location)):
            name = loc or DEFAULT_CODE_LOCATION
            out[name] = out.get(name, 0) + n
    return out


def workspace_entries(locations: Iterable[str]) -> dict:
    """A workspace.yaml's content: the default location as `defs` (as the repository's workspace.yaml),
    every other one as `location__<name>` of the same module, named after the location."""
    entries = []
    for name in [DEFAULT_CODE_LOCATION, *sorted(set(locations) - {DEFAULT_CODE_LOCATION})]:
        attribute = "defs" if name == DEFAULT_CODE_LOCATION else f"{ATTRIBUTE_PREFIX}{name}"
        entries.append({"python_module": {"module_name": DEFINITIONS_MODULE, "attribute": attribute,
                                          "location_name": name}})
    return {"load_from": entries}


def write_workspace(path: Path, locations: Iterable[str]) -> str:
    text = yaml.safe_dump(workspace_entries(locations), sort_keys=False)
    path.write_text(text, encoding="utf-8")
    return text


def touched_locations(before: MetadataCatalog, after: MetadataCatalog) -> set[str]:
    """The code locations whose definitions an apply changed (`before` → `after`, the control DB's
    catalog around it): those of the pipelines whose pipeline row, stages, or the targets, sources and
    rule sets their stages name changed (a pipeline moved between locations touches both). Any other
    structural change (applications: entity_raw) is the default location's, which serves it; operational
    rows (flags, throttles, profiles, ...) are read at run time and touch none. Not detected: a
    location whose stage reads a table that only now gets a producer in another location (it shows
    the dependency after its own next reload)."""
    def loc_of(catalog: MetadataCatalog) -> dict[str, str]:
        return {p.pipeline_id: p.location for p in catalog.pipelines}

    old_loc, new_loc = loc_of(before), loc_of(after)
    touched: set[str] = set()
    pipelines: set[str] = set()
    named: dict[str, set[tuple[str, str]]] = {}  # what a stage names -> its pipelines
    for cat in (before, after):
        for st in cat.stages:
            for kind, ident in (("targets", st.target_id), ("sources", st.source_id),
                                ("validation_rules", st.validation_set_id)):
                if ident:
                    named.setdefault(st.pipeline_id, set()).add((kind, ident))
    for section in STRUCTURE_SECTIONS:
        old = {e.key(): e for e in getattr(before, section)}
        new = {e.key(): e for e in getattr(after, section)}
        changed = [k for k in old.keys() | new.keys() if old.get(k) != new.get(k)]
        if not changed:
            continue
        if section in ("pipelines", "stages"):
            pipelines.update(k[0] for k in changed)
        elif section in ("targets", "sources", "validation_rules"):
            ids = {k[0] for k in changed}
            pipelines.update(pid for pid, refs in named.items() if any((section, i) in refs for i in ids))
        else:
            touched.add(DEFAULT_CODE_LOCATION)
    for pid in pipelines:
        touched.update(m[pid] for m in (old_loc, new_loc) if pid in m)
    return touched
