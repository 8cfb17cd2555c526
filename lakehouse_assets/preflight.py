"""Runs the pre-run check (lakehouse.runtime.preflight) once per run, from the first stage step that starts.

Every stage op calls `preflight(context, platform)` before it touches anything: the first one
of the run checks every stage the run materializes (`asset_layer.selected_asset_keys`, so a UI
"Materialize selected" checks its selection), later ones reuse the verdict. A run is one process
(in-process executor), so the verdict is kept in this module; another process simply checks again.
A failed check is a `dg.Failure` with `allow_retries=False`: no retry policy re-runs a
configuration mistake, and no stage of the run writes.
"""

from __future__ import annotations

import threading

import dagster as dg

from lakehouse.errors import ConfigurationError
from lakehouse.metadata.assets import stage_paths

_VERDICTS: dict[str, str | None] = {}  # run_id -> None (passed) or the error text
_LOCK = threading.Lock()
FAILURE_PREFIX = "configuration:"


def selected_stages(context: dg.OpExecutionContext, catalog) -> list[tuple[str, str]]:
    """(pipeline, stage) of the run's selected stage assets, in metadata order (one pass: a search of
    the targets per stage cost seconds at 1,000 pipelines)."""
    keys = {tuple(k.path) for k in context.job_def.asset_layer.selected_asset_keys}
    return [stage for path, stage in stage_paths(catalog).items() if path in keys]


def preflight(context: dg.OpExecutionContext, platform) -> None:
    from lakehouse.runtime.preflight import check_run

    with _LOCK:
        if context.run_id not in _VERDICTS:
            stages = selected_stages(context, platform.store.load())
            try:
                check_run(platform, stages)
                _VERDICTS[context.run_id] = None
                context.log.info(f"pre-run check passed for {len(stages)} stage(s)")
            except ConfigurationError as exc:
                _VERDICTS[context.run_id] = str(exc)
                platform.store.audit(run_id=context.run_id, event="preflight", outcome="failed",
                                     error_class="ConfigurationError", message=str(exc),
                                     details={"stages": [".".join(s) for s in stages]})
        verdict = _VERDICTS[context.run_id]
    if verdict is not None:
        raise dg.Failure(description=f"{FAILURE_PREFIX} {verdict}", allow_retries=False,
                         metadata={"error_code": "CONFIGURATION"})
