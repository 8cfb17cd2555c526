"""Which pipeline a stage asset belongs to, from its asset key (`[layer, target table]`).

There is no job per pipeline (issue 22: a thousand jobs made every code-server load and reload pay
for a thousand job snapshots). A pipeline's run is a run of the platform's one asset job with the
pipeline's stage assets selected, so the asset keys a run selects are what says which pipelines it
runs: a run worker builds those pipelines alone, and a run launched from the UI without a
`lakehouse/pipeline` tag still gets its pipeline's profile priority and kill switch.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import sqlalchemy as sa

from lakehouse.metadata.model import MetadataCatalog
from lakehouse.metadata.schema import TABLES

PIPELINE_TAG = "lakehouse/pipeline"


def stage_paths(catalog: MetadataCatalog) -> dict[tuple[str, ...], tuple[str, str]]:
    """{(layer, target table): (pipeline, stage)} of every stage whose target is in the metadata."""
    tables = {t.target_id: t.table for t in catalog.targets}
    return {(s.layer, tables[s.target_id]): (s.pipeline_id, s.stage_name) for s in catalog.stages
            if s.target_id in tables}


def pipeline_paths(catalog: MetadataCatalog, pipeline_id: str) -> list[tuple[str, str]]:
    """The asset key paths of a pipeline's stages, in stage order (what a run of the pipeline selects)."""
    return [(s.layer, catalog.target(s.target_id).table) for s in catalog.stages_of(pipeline_id)]


def pipeline_of_run(tags: Mapping[str, str], selected: Iterable[Sequence[str]] | None,
                    catalog: MetadataCatalog) -> str | None:
    """The pipeline a run runs: its `lakehouse/pipeline` tag, else the one pipeline owning every stage
    it selects (a UI "Materialize" of a pipeline's assets); None for anything else."""
    if tags.get(PIPELINE_TAG):
        return tags[PIPELINE_TAG]
    if not selected:
        return None
    by_path = stage_paths(catalog)
    owners = {by_path.get(tuple(p), (None, None))[0] for p in selected}
    return owners.pop() if len(owners) == 1 and None not in owners else None


def pipelines_of_paths(store, paths: Iterable[Sequence[str]]) -> set[str] | None:
    """The pipelines owning these asset key paths, in one query that reads only the stage and target
    columns a key is made of; None when a path is not a stage's (a run of something else)."""
    wanted = {tuple(p) for p in paths}
    if not wanted or any(len(p) != 2 for p in wanted):
        return None
    stages, targets = TABLES["stages"][0], TABLES["targets"][0]
    q = (sa.select(stages.c.pipeline_id, stages.c.layer, targets.c.table)
         .join(targets, targets.c.target_id == stages.c.target_id)
         .where(targets.c.table.in_(sorted({p[1] for p in wanted}))))
    with store.engine.connect() as conn:
        owner = {(layer, table): pid for pid, layer, table in conn.execute(q)}
    if not wanted <= owner.keys():
        return None
    return {owner[p] for p in wanted}
