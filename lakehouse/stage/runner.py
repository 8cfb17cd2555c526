"""Runs one stage: extract (plan the input) → write to an audit branch → validate → publish.

`StageRunner` is the facade the callers have always used (`StageRunner(platform, p, s).load(r.extract())`,
the Dagster load op, backfills, quarantine replays): one working context for the steps of one stage
in one process, whose methods are the step functions of `lakehouse.stage.steps`, where the
orchestration lives and where the path of one stage reads as values (request → plan → staged write
→ publish result). Operational metadata (flags, rules, retry and healing) is read from the control
database on every call, so a metadata update applies to the next step without a redeploy.

Features receive the step as a `StageContext` (this class is one), never import this module.
"""

from __future__ import annotations

import logging

from lakehouse.control.attempt import Retry
from lakehouse.platform import Platform
from lakehouse.stage import steps
from lakehouse.stage.core import (
    AuditFailed,
    Batch,
    DatasetDisabled,
    ExtractPlan,
    StageContext,
    StageDisabled,
    StageOutcome,
)
from lakehouse.stage.steps import StagedLoad
from lakehouse.stage.values import StagedWrite, StageRequest
from lakehouse.stage.wap_service import WriteAuditPublish

# the names callers have always imported from here
__all__ = ["AuditFailed", "Batch", "DatasetDisabled", "ExtractPlan", "Platform", "StageDisabled", "StageOutcome",
           "StageRunner", "StagedLoad"]

log = logging.getLogger(__name__)


class StageRunner(StageContext):
    """One stage of one pipeline in one run: the context its features see, and the steps over it.

    `retry`: the step's retry policy (the Dagster layer binds it: a RetryRequested or None), handed
    to the one wrapper around each step's work (lakehouse.control.attempt)."""

    def __init__(self, platform: Platform, pipeline_id: str, stage_name: str, run_id: str | None = None,
                 logger: logging.Logger | None = None, run_tags: dict[str, str] | None = None,
                 retry: Retry | None = None):
        super().__init__(platform, pipeline_id, stage_name, run_id, logger or log, run_tags=run_tags)
        steps.bind(self)  # features reach the source adapters and the reroute through the context
        self.retry = retry

    @property
    def request(self) -> StageRequest:
        return StageRequest.of(self)

    def extract(self) -> ExtractPlan:
        """What the load will read (`lakehouse.stage.steps.extract`)."""
        return steps.extract(self, retry=self.retry)

    def load(self, plan: ExtractPlan) -> StageOutcome:
        """Write every batch to the run's audit branch, validate it, then publish to main."""
        return self.publish(self.write_and_audit(plan))

    def write_and_audit(self, plan: ExtractPlan) -> StagedLoad:
        """The first half of `load` (`lakehouse.stage.steps.write_and_audit`): the input on the audit
        branch and the rules evaluated there; AuditFailed when a blocking rule failed."""
        return steps.write_and_audit(self, plan, retry=self.retry)

    def publish(self, staged: StagedLoad | StagedWrite) -> StageOutcome:
        """The second half of `load` (`lakehouse.stage.steps.publish_load`): the kill switch read again,
        the exactly-once publish, the after-publish bookkeeping. A stored `StagedWrite` is published
        from its reference."""
        if isinstance(staged, StagedWrite):
            staged = steps.live(steps.restored(staged, self), staged)
        return steps.publish_load(self, staged, retry=self.retry)

    def reference(self, staged: StagedLoad) -> StagedWrite:
        """The serialisable reference of a staged load (what the IO manager stores)."""
        return steps.reference(self, staged)

    def wap(self, *, quarantine: bool = True) -> WriteAuditPublish:
        """The write-audit-publish service for this step (lakehouse.stage.wap_service)."""
        return steps.wap(self, quarantine=quarantine)
