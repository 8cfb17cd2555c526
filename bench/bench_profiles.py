"""FIFO vs balanced vs focus on a mixed-criticality workload over shared sources.

A discrete-event simulation (1 s ticks) of what the Dagster instance does with our tags: the run
queue (max_concurrent_runs, `dagster/priority`, `tag_concurrency_limits` on
`lakehouse/reserve-key` per unique value) and op-granularity pools (slot claims ordered by run
priority + op priority, then FIFO). Runs get their tags at request time and queued runs are
re-tagged every sensor interval — using the SAME functions the platform calls
(`lakehouse.throughput.profiles.priority / reserve_key / QueueLoad`, default profile settings).
Expected durations are each pipeline's true mean, as the audit-log median learns after a few runs.
What is simulated is the scheduling, not Spark: it runs in about a second.

    .venv/bin/python bench/bench_profiles.py [--hours 4] [--seed 7] [--scale 1]
"""

from __future__ import annotations

import argparse
import random
import statistics
from collections import defaultdict
from dataclasses import dataclass, field

from lakehouse.throughput.profiles import DEFAULT_SETTINGS, QueueLoad, RunInfo, op_priority, priority, reserve_key

# Sizing rule for focus (docs/throughput.md): run slots >= sources x STANDARD_PER_KEY + critical
# pipelines that can fire together, so lower-priority runs can never take the critical runs' slots.
MAX_CONCURRENT_RUNS = 5
STANDARD_PER_KEY = 1  # run_queue tag_concurrency_limits: lakehouse/reserve-key, applyLimitPerUniqueValue
SENSOR_INTERVAL = 30
POOL_LIMITS = {"source:crm": 2, "source:events": 2, "source:erp": 2}
TARGET_LIMIT = 1


@dataclass(frozen=True)
class PipelineSpec:
    pipeline_id: str
    criticality: str
    source: str
    extract_s: int
    load_s: int
    period_s: int
    offset_s: int = 0

    @property
    def pools(self) -> tuple[str, str]:
        return (f"source:{self.source}", f"target:{self.pipeline_id}")

    def info(self) -> RunInfo:
        return RunInfo(self.pipeline_id, self.criticality, self.pools, float(self.extract_s + self.load_s))


def workload(scale: int = 1) -> list[PipelineSpec]:
    """Hourly/half-hourly batch pipelines that mostly fire together, as cron schedules do."""
    w = [
        PipelineSpec("orders_critical", "critical", "crm", 30, 60, 900),
        PipelineSpec("fraud_critical", "critical", "events", 20, 40, 600),
        PipelineSpec("crm_accounts", "high", "crm", 120, 120, 1800),
        PipelineSpec("crm_contacts", "normal", "crm", 240, 180, 1800),
        PipelineSpec("crm_history", "low", "crm", 600, 300, 3600),
        PipelineSpec("crm_notes", "low", "crm", 60, 60, 1800),
        PipelineSpec("events_clicks", "normal", "events", 180, 240, 1800),
        PipelineSpec("events_views", "normal", "events", 90, 60, 900),
        PipelineSpec("events_archive", "low", "events", 900, 300, 3600),
        PipelineSpec("erp_ledger", "high", "erp", 60, 120, 1800),
        PipelineSpec("erp_inventory", "normal", "erp", 300, 120, 1800),
        PipelineSpec("erp_snapshots", "low", "erp", 30, 30, 900),
    ]
    out = list(w)
    for k in range(1, scale):
        out += [PipelineSpec(f"{p.pipeline_id}_{k}", p.criticality, p.source, p.extract_s, p.load_s, p.period_s,
                             p.offset_s + 60 * k) for p in w if p.criticality != "critical"]
    return out


@dataclass
class Run:
    seq: int
    spec: PipelineSpec
    arrival: int
    priority: int = 0
    reserve: str = ""
    started: int | None = None
    done: int | None = None
    phase: str = "queued"  # queued, wait_extract, extract, wait_load, load, done
    phase_end: int = 0
    claim_time: int = 0


@dataclass
class Result:
    latencies: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    peak_pool: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    unfinished: int = 0


def simulate(specs: list[PipelineSpec], mode: str, hours: float, seed: int,
             max_runs: int = MAX_CONCURRENT_RUNS) -> Result:
    """mode: fifo | balanced | focus."""
    rng = random.Random(seed)
    horizon = int(hours * 3600)
    arrivals: dict[int, list[PipelineSpec]] = defaultdict(list)
    for s in specs:
        t = s.offset_s
        while t < horizon:
            arrivals[t + rng.randint(0, 20)].append(s)  # schedule jitter of a few seconds
            t += s.period_s
    settings = DEFAULT_SETTINGS.get(mode, {})
    runs: list[Run] = []
    queue: list[Run] = []
    active: list[Run] = []  # launched, not done
    in_pool: dict[str, int] = defaultdict(int)
    res = Result()
    seq = 0

    def tag(run: Run, load: QueueLoad) -> None:
        if mode == "fifo":
            run.priority, run.reserve = 0, f"open:{run.seq}"
            return
        info = run.spec.info()
        run.priority = priority(mode, settings, info, load)
        run.reserve = reserve_key(mode, info)

    def load_of(exclude: Run | None = None) -> QueueLoad:
        q = QueueLoad.of(r.spec.info() for r in (*queue, *active))
        return q.without(exclude.spec.info()) if exclude is not None else q

    t = 0
    end = horizon + 6 * 3600  # drain
    while t < end and (t < horizon or queue or active):
        for s in arrivals.get(t, []):
            r = Run(seq, s, t)
            seq += 1
            tag(r, load_of())
            runs.append(r)
            queue.append(r)
        if mode != "fifo" and t % SENSOR_INTERVAL == 0:
            for r in queue:
                tag_before = r.reserve
                tag(r, load_of(r))
                if tag_before.startswith("open:") and r.reserve.startswith("open:"):
                    r.reserve = tag_before
        # step completions
        for r in active:
            if r.phase in ("extract", "load") and r.phase_end <= t:
                pool = r.spec.pools[0] if r.phase == "extract" else r.spec.pools[1]
                in_pool[pool] -= 1
                if r.phase == "extract":
                    r.phase, r.claim_time = "wait_load", t
                else:
                    r.phase, r.done = "done", t
                    res.latencies[r.spec.pipeline_id].append(t - r.arrival)
        active = [r for r in active if r.phase != "done"]
        # dequeue (QueuedRunCoordinator): priority desc, then FIFO; skip runs blocked by tag limits
        per_key = defaultdict(int)
        for r in active:
            per_key[r.reserve] += 1
        for r in sorted(queue, key=lambda x: (-x.priority, x.seq)):
            if len(active) >= max_runs:
                break
            if r.reserve.startswith("standard:") and per_key[r.reserve] >= STANDARD_PER_KEY:
                continue
            queue.remove(r)
            r.started, r.phase, r.claim_time = t, "wait_extract", t
            per_key[r.reserve] += 1
            active.append(r)
        # pool slot claims: (run priority + op priority) desc, then claim time
        waiting = [r for r in active if r.phase in ("wait_extract", "wait_load")]
        for r in sorted(waiting, key=lambda x: (-(x.priority + op_priority(x.spec.criticality)), x.claim_time, x.seq)):
            pool = r.spec.pools[0] if r.phase == "wait_extract" else r.spec.pools[1]
            if in_pool[pool] >= POOL_LIMITS.get(pool, TARGET_LIMIT):
                continue
            in_pool[pool] += 1
            res.peak_pool[pool] = max(res.peak_pool[pool], in_pool[pool])
            if r.phase == "wait_extract":
                r.phase, r.phase_end = "extract", t + r.spec.extract_s
            else:
                r.phase, r.phase_end = "load", t + r.spec.load_s
        t += 1
    res.unfinished = sum(1 for r in runs if r.done is None)
    return res


def pct(values: list[int], q: float) -> float:
    if not values:
        return float("nan")
    v = sorted(values)
    return float(v[min(len(v) - 1, int(round(q * (len(v) - 1))))])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hours", type=float, default=4.0)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--scale", type=int, default=1, help="copies of the non-critical pipelines")
    ap.add_argument("--max-runs", type=int, default=MAX_CONCURRENT_RUNS, help="run queue max_concurrent_runs")
    args = ap.parse_args(argv)
    specs = workload(args.scale)
    critical = [s for s in specs if s.criticality == "critical"]
    alone = simulate(critical, "fifo", args.hours, args.seed, args.max_runs)
    alone_lat = [x for s in critical for x in alone.latencies[s.pipeline_id]]
    results = {m: simulate(specs, m, args.hours, args.seed, args.max_runs) for m in ("fifo", "balanced", "focus")}

    print(f"workload: {len(specs)} pipelines ({len(critical)} critical) over {len(POOL_LIMITS)} sources, "
          f"{args.hours:g} h of schedules, max_concurrent_runs={args.max_runs}, source pools "
          f"{POOL_LIMITS}, target pools {TARGET_LIMIT}")
    a50, a95 = pct(alone_lat, 0.5), pct(alone_lat, 0.95)
    print(f"critical alone: p50 {a50:.0f}s  p95 {a95:.0f}s  ({len(alone_lat)} runs)")
    print()
    head = f"{'profile':<9} {'crit p50':>9} {'crit p95':>9} {'p95/alone':>9} {'mean all':>9} {'vs fifo':>8} " \
           f"{'runs':>5} {'unfinished':>10}  peak per source"
    print(head)
    print("-" * len(head))
    fifo_mean = None
    for mode, r in results.items():
        crit = [x for s in critical for x in r.latencies[s.pipeline_id]]
        every = [x for v in r.latencies.values() for x in v]
        mean = statistics.fmean(every)
        fifo_mean = fifo_mean or mean
        peaks = ", ".join(f"{k.split(':', 1)[1]}={v}" for k, v in sorted(r.peak_pool.items()) if k.startswith("source:"))
        print(f"{mode:<9} {pct(crit, .5):>8.0f}s {pct(crit, .95):>8.0f}s {pct(crit, .95) / a95:>9.2f} "
              f"{mean:>8.0f}s {mean / fifo_mean:>8.2f} {len(every):>5} {r.unfinished:>10}  {peaks}")
    focus_crit = [x for s in critical for x in results["focus"].latencies[s.pipeline_id]]
    bal_mean = statistics.fmean([x for v in results["balanced"].latencies.values() for x in v])
    print()
    print(f"goal focus critical p95 <= 1.2 x alone: {pct(focus_crit, .95) / a95:.2f} "
          f"({'met' if pct(focus_crit, .95) <= 1.2 * a95 else 'NOT met'})")
    print(f"goal balanced mean < fifo mean: {bal_mean / fifo_mean:.2f} ({'met' if bal_mean < fifo_mean else 'NOT met'})")
    over = [f"{k}={v}>{POOL_LIMITS[k]}" for r in results.values() for k, v in r.peak_pool.items()
            if k in POOL_LIMITS and v > POOL_LIMITS[k]]
    print(f"pool limits held: {'yes' if not over else over}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
