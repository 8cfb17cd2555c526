"""Shared by the concurrency, outage and hygiene tests and bench/bench_concurrency.py: one
pipeline with three bronze stages — landing files (with a quarantine rule), S3 objects on moto and
an incremental JDBC table on PostgreSQL — so that every `lakehouse run` covers the three source
kinds at once, and helpers to start several runs as real processes and count rows independently."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
import zlib
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from tests import jvm_class_archive

PIPELINE = "conc"
TABLES = {"files": "bronze_{ns}.file_events", "s3": "bronze_{ns}.s3_events", "jdbc": "bronze_{ns}.db_events"}

METADATA = """
pipelines:
  - {{pipeline_id: conc, description: three source kinds in one run}}
sources:
  - {{source_id: conc_files, kind: files, format: jsonl, path: events, glob: "*.jsonl", batch_files: 2,
     columns: [{{name: id, type: string}}, {{name: v, type: bigint}}]}}
  - {{source_id: conc_s3, kind: s3, format: parquet, bucket: {bucket}, prefix: logs/, glob: "*.parquet",
     batch_files: 2}}
  - {{source_id: conc_db, kind: jdbc, jdbc_url: "{jdbc_url}", user_env: CONC_SRC_USER, password_env: CONC_SRC_PASSWORD,
     table: events, load_type: incremental, watermark_column: updated_at, primary_key: [id]}}
targets:
  - {{target_id: conc_file_events, namespace: bronze_{ns}, table: file_events}}
  - {{target_id: conc_s3_events, namespace: bronze_{ns}, table: s3_events}}
  - {{target_id: conc_db_events, namespace: bronze_{ns}, table: db_events, write_mode: merge, merge_keys: [id]}}
stages:
  - {{pipeline_id: conc, stage_order: 1, stage_name: files, layer: bronze, source_id: conc_files,
     target_id: conc_file_events, validation_set_id: conc_rules}}
  - {{pipeline_id: conc, stage_order: 2, stage_name: s3, layer: bronze, source_id: conc_s3, target_id: conc_s3_events}}
  - {{pipeline_id: conc, stage_order: 3, stage_name: db, layer: bronze, source_id: conc_db, target_id: conc_db_events}}
validation_rules:
  - rule_set_id: conc_rules
    rules:
      - {{name: id_present, type: not_null, columns: [id], severity: warn, action: quarantine}}
platform_settings:
{settings}
"""


def metadata(ns: str, bucket: str, jdbc_url: str, settings: dict[str, str] | None = None) -> str:
    rows = "\n".join(f"  - {{setting_key: {k}, setting_value: \"{v}\"}}" for k, v in (settings or {}).items())
    return METADATA.format(ns=ns, bucket=bucket, jdbc_url=jdbc_url, settings=rows or "  []")


@dataclass
class Expected:
    """Every id that must be in each table exactly once (and the quarantined rows' v values)."""

    files: list[str] = field(default_factory=list)
    quarantined: list[int] = field(default_factory=list)
    s3: list[str] = field(default_factory=list)
    jdbc: list[int] = field(default_factory=list)


def land_files(landing: Path, tag: str, n_files: int, rows: int, expected: Expected) -> None:
    """JSON lines; the last row of each file has no id (quarantined), identified by its v."""
    landing.mkdir(parents=True, exist_ok=True)
    for i in range(n_files):
        lines = []
        for j in range(rows):
            v = zlib.crc32(f"{tag}/{i}/{j}".encode())
            if j == rows - 1:
                lines.append({"id": None, "v": v})
                expected.quarantined.append(v)
            else:
                lines.append({"id": f"{tag}-f{i}-{j}", "v": v})
                expected.files.append(f"{tag}-f{i}-{j}")
        (landing / f"{tag}-{i:03d}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))


def put_s3(client, bucket: str, tag: str, n_files: int, rows: int, expected: Expected) -> None:
    for i in range(n_files):
        ids = [f"{tag}-s{i}-{j}" for j in range(rows)]
        buf = io.BytesIO()
        pq.write_table(pa.table({"id": ids, "n": list(range(rows))}), buf)
        client.put_object(Bucket=bucket, Key=f"logs/{tag}-{i:03d}.parquet", Body=buf.getvalue())
        expected.s3.extend(ids)


def create_source_table(conn) -> None:
    with conn.cursor() as cur:
        cur.execute("CREATE TABLE IF NOT EXISTS events (id bigint PRIMARY KEY, updated_at timestamp NOT NULL, v text)")


def insert_rows(conn, first: int, n: int, expected: Expected) -> None:
    with conn.cursor() as cur:
        for i in range(first, first + n):
            cur.execute("INSERT INTO events VALUES (%s, %s, %s)", (i, datetime(2024, 1, 1) + timedelta(seconds=i), f"v{i}"))
            expected.jdbc.append(i)


def run_env(base: dict[str, str], **extra: str) -> dict[str, str]:
    env = jvm_class_archive.isolated_env()  # keeps the test JVMs' options and class archive
    env.update({"LAKEHOUSE_SPARK_MASTER": "local[1]", "LAKEHOUSE_SPARK_DRIVER_MEMORY": "1g",
                "LAKEHOUSE_SHUFFLE_PARTITIONS": "1", "PYTHONUNBUFFERED": "1"})
    env.update(base)
    env.update(extra)
    return env


def start_runs(k: int, env: dict[str, str], log_dir: Path, tag: str = "run") -> list[tuple[subprocess.Popen, Path]]:
    """k `lakehouse run conc` processes at once (each its own JVM), output to log files."""
    log_dir.mkdir(parents=True, exist_ok=True)
    out = []
    for i in range(k):
        log = log_dir / f"{tag}-{i}.log"
        fh = log.open("w")
        proc = subprocess.Popen([sys.executable, "-m", "lakehouse.cli", "run", PIPELINE], env=env, stdout=fh,
                                stderr=subprocess.STDOUT, start_new_session=True)
        fh.close()
        out.append((proc, log))
    return out


def succeeded(rc: int, out: str) -> bool:
    """`lakehouse run` ended in success: exit 0, or 3 when a warn-severity check failed (the runs
    here quarantine rows under a warn rule), with the summary saying SUCCESS."""
    from lakehouse.stage.run_summary import EXIT_CODES, SUCCESS, WARNINGS

    return rc in (EXIT_CODES[SUCCESS], EXIT_CODES[WARNINGS]) and "): SUCCESS" in out


def release_when_paused(pause: Path, runs: list[tuple[subprocess.Popen, Path]], timeout: float,
                        point: str = "before_publish") -> None:
    """Wait until every run is paused at `point` (LAKEHOUSE_PAUSE_AT), then let them all go on
    at once; fails if a run ends first or the wait exceeds `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while len(list(pause.glob(f"{point}.*"))) < len(runs):
        assert all(p.poll() is None for p, _ in runs), [log.read_text()[-3000:] for _, log in runs]
        assert time.monotonic() < deadline, f"runs never all reached {point}"
        time.sleep(0.5)
    (pause / "release").touch()


def wait_runs(runs: list[tuple[subprocess.Popen, Path]], timeout: float) -> list[tuple[int, str]]:
    deadline = time.monotonic() + timeout
    results = []
    for proc, log in runs:
        try:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        results.append((proc.returncode, log.read_text()))
    return results


def kill_all(runs: list[tuple[subprocess.Popen, Path]]) -> None:
    for proc, _ in runs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def counts(catalog, ident: str, column: str) -> Counter:
    if not catalog.table_exists(ident):
        return Counter()
    return Counter(catalog.load_table(ident).scan(selected_fields=(column,)).to_arrow().column(column).to_pylist())


def check_exactly_once(catalog, ns: str, expected: Expected) -> dict[str, str]:
    """Each table's ids against the expected ones: '' when exact, else what is wrong."""
    problems = {}
    wanted = {"files": Counter(expected.files), "s3": Counter(expected.s3), "jdbc": Counter(expected.jdbc)}
    for kind, ident in TABLES.items():
        got = counts(catalog, ident.format(ns=ns), "id")
        if got != wanted[kind]:
            dup = {k: n for k, n in got.items() if n > 1}
            problems[kind] = (f"{sum(got.values())} rows for {len(wanted[kind])} expected; duplicated {len(dup)} "
                              f"e.g. {list(dup.items())[:3]}; missing {len(set(wanted[kind]) - set(got))}")
    q = counts(catalog, TABLES["files"].format(ns=ns) + "__quarantine", "v")
    if q != Counter(expected.quarantined):
        problems["quarantine"] = f"{sum(q.values())} quarantined rows for {len(expected.quarantined)} expected"
    return problems
