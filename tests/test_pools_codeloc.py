"""Code location for the daemon tests of pools and profiles: the REAL Definitions with step bodies
that only hold their slot.

`build_definitions()` builds the graph exactly as production does (the factory's extract op in
`source:<id>`, load op in `target:<id>`, op `dagster/priority` tags, runs of the asset job); only
`StageRunner.extract` / `.write_and_audit` / `.publish` are replaced by a sleep of
LAKEHOUSE_TEST_STEP_SECONDS (and sensors other than the throughput sensor are left out), because
what these tests measure is Dagster's scheduling (queue, pools, priorities), and a JVM per run on a
loaded 2-core machine would make them take tens of minutes. Spark pacing is tested separately in
tests/test_throttle.py. `defs` is built lazily (module __getattr__) so collecting this module is free.
"""

from __future__ import annotations

import os
import time


def _patched_definitions():
    from lakehouse.stage import runner

    def extract(self):
        time.sleep(float(os.environ.get("LAKEHOUSE_TEST_STEP_SECONDS", "2")))
        return runner.ExtractPlan(self.stage.pipeline_id, self.stage.stage_name, kind="test",
                                  source_id=self.stage.source_id)

    def write_and_audit(self, plan):  # the load op's body (its publish is the IO manager's, below)
        time.sleep(float(os.environ.get("LAKEHOUSE_TEST_STEP_SECONDS", "2")))
        return runner.StagedLoad(plan, runner.StageOutcome(
            self.stage.pipeline_id, self.stage.stage_name, self.target, True, "",
            skipped_reason="daemon scheduling test: step body only holds its slot"))

    def publish(self, staged):
        return staged.outcome

    runner.StageRunner.extract = extract
    runner.StageRunner.write_and_audit = write_and_audit
    runner.StageRunner.publish = publish
    from lakehouse_assets.definitions import build_definitions

    defs = build_definitions()
    # other teams' always-on sensors would add their own runs to the test's queue: keep ours only
    keep = [s for s in (defs.sensors or []) if s.name == "lakehouse_throughput_sync"]
    from dagster_shared.record import copy

    return copy(defs, sensors=keep)


def __getattr__(name: str):
    if name == "defs":
        globals()["defs"] = _patched_definitions()
        return globals()["defs"]
    raise AttributeError(name)
