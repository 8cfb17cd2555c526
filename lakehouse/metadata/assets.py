"""Which pipeline a stage asset belongs to, from its asset key (`[layer, target table]`).

There is no job per pipeline (issue 22: a thousand jobs made every code-server load and reload pay
for a thousand job snapshots). A pipeline's run is a run of the platform's one asset job with the
pipeline's stage assets selected, so the asset keys a run selects are what says which pipelines it
runs: a run launched from the UI without a `lakehouse/pipeline` tag still gets its pipeline's profile priority and kill switch.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from lakehouse.metadata.model import MetadataCatalog

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
