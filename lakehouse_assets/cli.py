"""`lakehouse run`: materialize a pipeline headless through the Definitions the UI loads.

It executes a Dagster job, so it belongs to the Dagster layer: the domain CLI (lakehouse.cli)
gets it through the `lakehouse.cli` entry-point group declared in pyproject.toml and never
imports this package (an import-linter contract checks that).
"""

from __future__ import annotations

import argparse
import gc
import sys

from lakehouse.control.flags import pipeline_stopped
from lakehouse.engines.choice import may_need_spark
from lakehouse.lineage.background import in_background as lineage_in_background
from lakehouse.metadata.derived import read_structure
from lakehouse.ops.alerts import run_finished
from lakehouse.orchestration.instance import headless_instance, run_tags
from lakehouse.orchestration.runs import failure_summary
from lakehouse.platform import Platform
from lakehouse.runtime.pyarrow_probes import answer_pandas_probes
from lakehouse.runtime.spark import release_jvm_at_exit
from lakehouse.runtime.startup import resume_collector
from lakehouse.stage.run_summary import WARN_ERROR_SETTING, RunSummary


def cmd_run(args) -> int:
    """Materialize a pipeline headless through the same Definitions the UI loads, on the persistent
    Dagster instance (so pools hold), and end with the per-stage summary (lakehouse.stage.run_summary)."""
    platform = Platform.from_env()
    stopped = pipeline_stopped(platform.store, args.pipeline)
    if stopped:  # a kill switch is not a failure: no run, no JVM, no stack trace; its own exit code
        platform.store.audit(pipeline_id=args.pipeline, event="kill_switch", action="run", outcome="stopped",
                             message=f"lakehouse run not started: {stopped}")
        summary = RunSummary("-", args.pipeline, [], stopped=stopped)
        print(summary.table())
        print(f"Fix: `lakehouse pipeline enable {args.pipeline}` (then run it again)", file=sys.stderr)
        return summary.exit_code
    # this pipeline's rows (and the throttles), not every pipeline's: a run's cost does not grow with the platform
    catalog = read_structure(platform.store, [args.pipeline]).catalog
    settings_rows = platform.store.load(["platform_settings"]).platform_settings
    warn_error = getattr(args, "warn_error", False) or any(
        r.setting_key == WARN_ERROR_SETTING and r.setting_value.strip().lower() in ("true", "1", "yes", "on")
        for r in settings_rows)
    spark_maybe = may_need_spark(catalog.model_copy(update={"platform_settings": settings_rows}), args.pipeline)
    if not spark_maybe and getattr(args, "own_process", False):
        # an Arrow-only run hands pyarrow no pandas objects: its probes for them are answered
        # without importing pandas (302 modules, ~0.15 s of CPU; lakehouse.runtime.pyarrow_probes says when that is safe)
        answer_pandas_probes()
    if platform.settings.spark_warmup and spark_maybe:
        # the JVM starts on the other core while Dagster is imported and the job is built, so
        # before those imports (~2 s: the JVM's launch is then what the first stage waits for, as
        # a hand-written script's); with LAKEHOUSE_SPARK_WARMUP=0 it starts only when a step needs
        # it (a run with nothing to load, e.g. one of several concurrent runs whose files others
        # claimed, then never starts one). A pipeline the Arrow engine writes whole
        # (lakehouse.engines.choice) starts none.
        platform.warm_spark()
    # Dagster is imported here, not when the parser is built: every other command starts without it
    from dagster import DagsterEventType

    from lakehouse_assets.definitions import build_definitions, pipeline_job
    from lakehouse_assets.run_summary import record, stage_keys, summarize

    if not any(p.pipeline_id == args.pipeline for p in catalog.pipelines):
        platform.store.load(["pipelines"]).pipeline(args.pipeline)  # unknown id -> KeyError naming the known ones
    catalog = catalog.model_copy(update={"throttles": platform.store.load(["throttles"]).throttles})
    headless = headless_instance(platform.settings, catalog, ephemeral=args.ephemeral)
    for note in headless.notes:
        print(f"warning: {note}", file=sys.stderr)
    # this pipeline's stages, not every pipeline's; the run is the asset job with them selected, as
    # a schedule's, a sensor's or the UI's run of the pipeline is (there is no job per pipeline)
    defs = build_definitions(platform, pipelines=[args.pipeline])
    job = pipeline_job(defs, args.pipeline)
    quiet = {} if args.verbose else {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}
    # what is alive now (the imported modules, the definitions, the instance) lives until the process
    # ends: the cyclic collector's full collections during the run need not traverse it again (~20 %
    # of a small run's CPU went to them). New objects are still collected; as in the code server.
    # The process's entry paused the collector for the start-up that made them: it resumes here
    gc.freeze()
    resume_collector()
    # the selection named again: a run records only the selection it is given (as a UI run's), which
    # the run summary sensor and the kill switch read. Each stage's DataHub emission runs beside the
    # run on the other core (lakehouse.lineage.background); the block ends when the last one is out.
    with lineage_in_background():
        result = job.execute_in_process(instance=headless.instance, raise_on_error=False, run_config=quiet,
                                        asset_selection=sorted(job.asset_layer.selected_asset_keys),
                                        tags={"lakehouse/pipeline": args.pipeline, "lakehouse/launched_by": "cli",
                                              **run_tags()})
        # the checks the run planned are logged when it is created, not in the execution's events: a
        # check without a result is "not evaluated" (lakehouse_assets.run_summary)
        planned = [r.dagster_event for r in headless.instance.all_logs(
            result.run_id, of_type=DagsterEventType.ASSET_CHECK_EVALUATION_PLANNED) if r.dagster_event is not None]
        summary = summarize([*planned, *result.all_events], result.run_id, args.pipeline,
                            stage_keys(catalog, args.pipeline, job.asset_layer.selected_asset_keys))
        summary.warn_error = warn_error
        record(headless.instance if headless.persistent else None, platform, summary, args.pipeline)
        print(summary.table())
        if not result.success:  # no daemon may be watching this instance: raise the run-failure alert here
            run = headless.instance.get_run_by_id(result.run_id)
            message, failed = failure_summary(headless.instance, run.run_id, f"run {result.run_id} failed", catalog)
            run_finished(platform.store, run_id=result.run_id, status="FAILURE", job_name=run.job_name,
                         tags=dict(run.tags), message=message, failed=failed)
    release_jvm_at_exit()  # a JVM still starting (nothing needed it) would keep a core busy after we exit
    return summary.exit_code


def register(sub) -> None:
    """The `run` subcommand, added to the `lakehouse` parser (entry point `lakehouse.cli`)."""
    r = sub.add_parser("run", help="materialize a pipeline headless (same code as the UI); exit 0 success "
                                   "(warnings included: a warn check failed, rows quarantined), 1 failure, "
                                   "3 warnings with --warn-error, 4 stopped by a kill switch (not started)")
    r.add_argument("pipeline")
    r.add_argument("--warn-error", action="store_true",
                   help=f"warnings are errors: exit 3 when a warn-severity check failed or rows were quarantined "
                        f"(also the platform setting {WARN_ERROR_SETTING}: true)")
    r.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                   help="print Dagster's event stream (default: only warnings, then the summary)")
    r.add_argument("--ephemeral", action="store_true",
                   help="use a throwaway Dagster instance (pools, i.e. max_concurrent throttles, are NOT enforced) "
                        "instead of $DAGSTER_HOME or $LAKEHOUSE_HOME/dagster_home")
    r.set_defaults(func=cmd_run)
