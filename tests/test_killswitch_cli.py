"""Kill switch and audit from the command line on the test's control DB: the commands through the CLI's
`main(argv)` in this process (its exit code, stdout and stderr), one of them as the `lakehouse` process
too (the console script finds the control DB from the environment). Each `lakehouse` process costs
~0.4 s of imports, and the fast lane ran eleven of them here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from lakehouse.cli import main
from lakehouse.metadata.loader import load_metadata
from lakehouse.metadata.store import MetadataStore

BIN = Path(sys.executable).parent / "lakehouse"
META = """
pipelines:
  - {pipeline_id: kc}
sources:
  - {source_id: kc_raw, kind: files, format: jsonl, path: kc}
targets:
  - {target_id: kc_bronze, namespace: bronze, table: kc}
stages:
  - {pipeline_id: kc, stage_order: 1, stage_name: ingest, layer: bronze, source_id: kc_raw, target_id: kc_bronze}
healing_actions:
  - {healing_id: conflict, error_code: ICEBERG_COMMIT_CONFLICT, actions: [refresh_and_recommit], priority: 1}
  - {healing_id: anything_iceberg, message_regex: "iceberg", actions: [retry_after_backoff], priority: 9}
"""


def process(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN), *args], env=dict(os.environ), capture_output=True, text=True, timeout=300)


def test_disable_enable_status_explain_and_audit(settings, tmp_path, capsys):
    def cli(*args: str) -> subprocess.CompletedProcess:
        capsys.readouterr()
        code = main(list(args))
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(args, code, out, err)

    store = MetadataStore(settings.control_db_url)
    f = tmp_path / "kc.yaml"
    f.write_text(META)
    store.apply(load_metadata(f))

    assert cli("stage", "disable", "kc", "ingest").returncode == 0
    assert store.enabled("kc", "ingest") == (False, "stage kc.ingest is disabled by control_flags")
    assert store.enabled("kc")[0]  # the pipeline itself stays enabled
    status = process("control", "status").stdout  # the console script, on the control DB of the environment
    [row] = [ln.split() for ln in status.splitlines() if " ingest " in f" {ln} "]
    assert row[:3] == ["kc", "ingest", "False"]
    assert cli("stage", "enable", "kc", "ingest").returncode == 0
    assert cli("pipeline", "disable", "kc").returncode == 0
    assert store.enabled("kc", "ingest")[0] is False
    unknown = cli("pipeline", "disable", "nope")
    assert unknown.returncode == 2 and "unknown pipeline 'nope'" in unknown.stderr

    out = cli("control", "explain", "org.apache.iceberg.exceptions.CommitFailedException: stale").stdout
    assert "ICEBERG_COMMIT_CONFLICT" in out
    assert out.index("conflict") < out.index("anything_iceberg")  # priority order

    store.audit(run_id="r1", pipeline_id="kc", stage_name="ingest", event="healing_action",
                action="refresh_and_recommit", outcome="applied", error_class="CommitFailedException",
                message="stale", duration_ms=12)
    store.audit(run_id="r2", pipeline_id="other", event="healing_action", action="shrink_batch", outcome="applied")
    printed = cli("audit", "--pipeline", "kc", "--since", "2000-01-01T00:00:00").stdout
    assert "refresh_and_recommit" in printed and "shrink_batch" not in printed
    assert "(none)" in cli("audit", "--pipeline", "kc", "--since", "2999-01-01T00:00:00").stdout
