"""A slot of a second Dagster pool, held by an op for part of its work.

An op sits in one pool only (Dagster's `pool=`). The maintenance op of a namespace runs in pool
`maintenance:<ns>` and works on the namespace's tables one after another; while it works on a table
it must also hold a slot of that table's `target:<id>` pool, the pool the target's load ops claim,
so that maintenance and loads together never exceed the target's limit. One op per table would
get that from `pool=` alone, but cost the code server seconds of CPU per load at 1,000 pipelines
(BENCHMARKS.md, issue 22).

`pool_slot` claims through the instance's event log storage (`instance.event_log_storage`, the
concurrency methods the UI and `dagster instance concurrency` use), as Dagster's step executor does,
so the claim behaves as a step's: its priority is the run's `dagster/priority` plus the op's; a
pool with no limit gets the instance's `concurrency.pools.default_limit`; with
`pools.granularity: run` nothing is claimed (the run coordinator gates whole runs then, and load ops
claim nothing either); an instance whose storage has no pools (an ephemeral one) enforces none.

The claim is made for the step key `<op step key>[<pool>]`: Dagster frees slots per (run, step key),
so freeing this one never frees the op's own slot of its pool. While the pool is full the op waits
and polls the run: a run being terminated (CANCELING, or the interrupt Dagster raises in the op)
stops the wait. The slot is freed when the block ends, also on an error; a run worker that dies
leaves it to run monitoring, which frees every slot of an ended run after
`run_monitoring.free_slots_after_run_end_seconds`, as for any step's slot.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import dagster as dg

PRIORITY_TAG = "dagster/priority"  # run and op tag: higher first (Dagster's documented tag)
POLL_SECONDS = 1.0
TERMINATING = (dg.DagsterRunStatus.CANCELING, dg.DagsterRunStatus.CANCELED)


def claimant(step_key: str, pool: str) -> str:
    """The step key a slot of `pool` is claimed under (shown as such in the UI's pool page)."""
    return f"{step_key}[{pool}]"


def _step_key(context) -> str:
    """The op's step key: its name, for an op at the top of its job (an `@asset`, as maintenance's)."""
    return context.op_def.name


def _op_priority(context) -> int:
    try:
        return int((context.op_def.tags or {}).get(PRIORITY_TAG, 0))
    except ValueError:
        return 0


def _run_priority(run: dg.DagsterRun) -> int:
    try:
        return int((run.tags or {}).get(PRIORITY_TAG, 0))
    except ValueError:
        return 0


def _limited(storage, pool: str) -> bool:
    """Whether `pool` has a limit to claim against (given it the instance's default limit if it has none)."""
    config = storage.get_pool_config()
    default = config.default_pool_limit
    limits = {p.name: p for p in storage.get_pool_limits()}
    info = limits.get(pool)
    if (info is None and default is not None) or (info is not None and info.from_default and info.limit != default):
        storage.initialize_concurrency_limit_to_default(pool)
        info = {p.name: p for p in storage.get_pool_limits()}.get(pool)
    return info is not None


@contextmanager
def pool_slot(context: dg.OpExecutionContext | dg.AssetExecutionContext, pool: str, *,
              poll_seconds: float = POLL_SECONDS) -> Iterator[float]:
    """Hold one slot of `pool` for the block; yields the seconds waited for it."""
    instance, run = context.instance, context.run
    storage = instance.event_log_storage
    started = time.monotonic()
    if not storage.supports_global_concurrency_limits or \
            str(getattr(storage.get_pool_config().pool_granularity, "value", "")).lower() == "run" or \
            not _limited(storage, pool):
        yield 0.0  # no pool to claim against: as a step's claim, it passes at once
        return
    key = claimant(_step_key(context), pool)
    priority = _run_priority(run) + _op_priority(context)
    told = False
    try:
        while not storage.claim_concurrency_slot(pool, run.run_id, key, priority).is_claimed:
            if not told:
                context.log.info(f"waiting for a slot of pool {pool} (its limit is reached)")
                told = True
            current = instance.get_run_by_id(run.run_id)
            if current is not None and current.status in TERMINATING:
                raise dg.DagsterExecutionInterruptedError(f"run {run.run_id} is being terminated: stopped waiting "
                                                          f"for a slot of pool {pool}")
            time.sleep(poll_seconds)
        waited = time.monotonic() - started
        if told:
            context.log.info(f"slot of pool {pool} claimed after {waited:.1f} s")
        yield waited
    finally:
        # frees the slot, or the pending claim of a wait that ended (an error, a termination)
        storage.free_concurrency_slot_for_step(run.run_id, key)
