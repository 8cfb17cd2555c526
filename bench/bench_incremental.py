"""The hourly run of the demo pipeline with 1x and 30x history behind it: incremental vs full recompute.

    .venv/bin/python bench/bench_incremental.py                          # 24 h vs 720 h of history, 1,000 rows/h, 3 rounds
    .venv/bin/python bench/bench_incremental.py --hours 24 --rows-per-hour 500 --rounds 5
    .venv/bin/python bench/bench_incremental.py --no-silver-rules          # without silver's audit

Four platforms in one process (one SparkSession, four catalogs and control DBs in temp homes): the
demo metadata as shipped (silver merges the new bronze rows on event_id, gold recomputes the days
they touched: `incremental`) and the same without the `incremental` blocks (every run recomputes
silver from all of bronze and gold from all of silver), each with `--hours` (1x) and 30 x `--hours`
(30x) of history already loaded. Each round lands one new hour (with late events for an old day and
events sent again) in all four, runs bronze, silver and gold in each, in an order that rotates per
round, and times silver + gold. Prints each round and the medians: incremental 30x / 1x (goal: at
most 1.3) beside full recompute 30x / 1x, and full / incremental at 30x; the load average goes with
them (2 shared cores: read ratios, not seconds). CPU time (this process and its JVM, from /proc) is
timed beside wall time: on a shared machine it swings much less than wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import resource
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "metadata" / "demo"
START = datetime(2026, 1, 1, tzinfo=UTC)


def write_hours(folder: Path, name: str, hours: range, rows: int, rng: random.Random, next_id: list[int]) -> None:
    """One JSON-lines file of `rows` events per hour in `hours`; 1% late (an old day), 1% sent again."""
    lines = []
    for h in hours:
        for _ in range(rows):
            n = next_id[0]
            next_id[0] += 1
            if n and n % 100 == 0:  # an at-least-once duplicate of an earlier event
                n = rng.randrange(max(1, n - 50 * rows), n)
            hour = h if n % 100 != 50 else rng.randrange(0, h + 1)  # a late event
            ts = START + timedelta(hours=hour, seconds=rng.randrange(3600))
            lines.append(json.dumps({"event_id": f"e{n:010d}", "user_id": rng.randrange(1, 5000),
                                     "event_type": rng.choice(("view", "click", "purchase", "signup")),
                                     "event_ts": ts.strftime("%Y-%m-%d %H:%M:%S"), "country": "US",
                                     "context": {"device": "web", "app_version": "1.0"}}, separators=(",", ":")))
    (folder / name).write_text("\n".join(lines) + "\n")


def tree_cpu() -> float:
    """CPU seconds (user + system) of this process and its child JVMs so far."""
    from lakehouse.runtime import procstat
    from lakehouse.runtime.spark import _own_spark_children

    me = resource.getrusage(resource.RUSAGE_SELF)
    total = me.ru_utime + me.ru_stime
    for pid in _own_spark_children():
        st = procstat.read(pid)
        total += st.cpu if st is not None else 0.0  # utime + stime
    return total


class Lake:
    """One platform (its own home, catalog and control DB) with the demo pipeline applied."""

    def __init__(self, label: str, incremental: bool, hours: int, rows: int, seed: int, silver_rules: bool = True):
        from lakehouse.metadata.loader import load_metadata
        from lakehouse.metadata.store import MetadataStore
        from lakehouse.settings import load_settings
        from lakehouse.stage.runner import Platform

        self.label, self.hours, self.rows = label, hours, rows
        home = Path(tempfile.mkdtemp(prefix=f"bench_incr_{label}_"))
        meta = home / "meta"
        (meta / "sql").mkdir(parents=True)
        for p in DEMO.rglob("*"):
            if p.is_file():
                text = p.read_text()
                if p.name == "user_events.yaml":
                    if not incremental:
                        text = re.sub(r"\n    incremental: \{[^\n]*\}", "", text)
                    if not silver_rules:  # what the audit of silver's rules costs
                        text = text.replace("    validation_set_id: silver_events_rules\n", "")
                (meta / p.relative_to(DEMO)).write_text(text)
        os.environ.update({"LAKEHOUSE_HOME": str(home), "LAKEHOUSE_CATALOG_NAME": f"lake_{label}",
                           "LAKEHOUSE_CATALOG_URI": f"sqlite:///{home / 'catalog.db'}",
                           "LAKEHOUSE_WAREHOUSE": f"file://{home / 'warehouse'}",
                           "LAKEHOUSE_CONTROL_DB_URL": f"sqlite:///{home / 'control.db'}"})
        settings = load_settings()
        self.platform = Platform(settings, MetadataStore(settings.control_db_url))
        self.platform.store.apply(load_metadata(meta))
        assert any(s.incremental for s in self.platform.catalog().stages) == incremental
        self.landing = settings.landing_dir / "user_events"
        self.landing.mkdir(parents=True)
        self.rng, self.next_id = random.Random(seed), [0]
        self.platform.spark()  # registers this catalog on the shared session
        write_hours(self.landing, "history.jsonl", range(hours), rows, self.rng, self.next_id)
        self.run()  # the history, loaded: the first run is a full one either way
        self.hour = hours

    def run(self) -> dict[str, float]:
        from lakehouse.stage.runner import StageRunner

        out = {}
        for stage in ("bronze_ingest", "silver_clean", "gold_aggregate"):
            t0, c0 = time.perf_counter(), tree_cpu()
            r = StageRunner(self.platform, "user_events_etl", stage)
            outcome = r.load(r.extract())
            assert outcome.published, (self.label, stage, outcome.skipped_reason)
            out[stage] = time.perf_counter() - t0
            out[stage + "_cpu"] = tree_cpu() - c0
        return out

    def hourly(self) -> dict[str, float]:
        write_hours(self.landing, f"hour_{self.hour:05d}.jsonl", range(self.hour, self.hour + 1), self.rows,
                    self.rng, self.next_id)
        self.hour += 1
        return self.run()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hours", type=int, default=24, help="hours of history at 1x (30x: thirty times as many)")
    ap.add_argument("--rows-per-hour", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-silver-rules", action="store_true", help="silver without its validation rules (what the "
                    "audit of the merged rows costs)")
    args = ap.parse_args()
    os.environ.setdefault("LAKEHOUSE_SPARK_MASTER", "local[2]")
    os.environ.setdefault("LAKEHOUSE_SHUFFLE_PARTITIONS", "2")

    t0 = time.monotonic()
    lakes = [Lake(f"{kind}{mult}x", kind == "inc", args.hours * mult, args.rows_per_hour, seed=mult,
                  silver_rules=not args.no_silver_rules)
             for kind in ("inc", "full") for mult in (1, 30)]
    print(f"history loaded in {time.monotonic() - t0:.0f} s: {args.hours} h and {30 * args.hours} h of "
          f"{args.rows_per_hour} rows/h; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    times: dict[str, list[float]] = {lake.label: [] for lake in lakes}
    cpus: dict[str, list[float]] = {lake.label: [] for lake in lakes}
    for rnd in range(args.rounds):
        order = lakes[rnd % 4:] + lakes[:rnd % 4]
        for lake in order:
            t = lake.hourly()
            times[lake.label].append(t["silver_clean"] + t["gold_aggregate"])
            cpus[lake.label].append(t["silver_clean_cpu"] + t["gold_aggregate_cpu"])
            print(f"round {rnd + 1} {lake.label:>8}: bronze {t['bronze_ingest']:6.2f} s  silver {t['silver_clean']:6.2f} s"
                  f" (cpu {t['silver_clean_cpu']:6.2f} s)  gold {t['gold_aggregate']:6.2f} s (cpu "
                  f"{t['gold_aggregate_cpu']:6.2f} s)  load {os.getloadavg()[0]:.2f}", flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    cmed = {k: statistics.median(v) for k, v in cpus.items()}
    print("\nmedian silver+gold per hourly run: " + ", ".join(f"{k} {v:.2f} s (cpu {cmed[k]:.2f} s)"
                                                            for k, v in med.items()))
    print(f"incremental 30x/1x = {med['inc30x'] / med['inc1x']:.3f}   CPU {cmed['inc30x'] / cmed['inc1x']:.3f}"
          "   (goal <= 1.3)")
    print(f"full recompute 30x/1x = {med['full30x'] / med['full1x']:.3f}   CPU {cmed['full30x'] / cmed['full1x']:.3f}")
    print(f"full / incremental at 30x = {med['full30x'] / med['inc30x']:.2f}   at 1x = {med['full1x'] / med['inc1x']:.2f}")
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
