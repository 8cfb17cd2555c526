"""A class-data-sharing (CDS) archive of the test JVMs' classes: every JVM a slow test starts loads
Spark's and Iceberg's classes mapped from it instead of parsing and verifying them again.

Each `lakehouse run`, `dagster dev` run worker or code server a slow test starts is a new JVM, and
loading Spark's classes was about half of a short JVM's CPU here (a session, an Iceberg create,
append and read: 13-17 s of JVM CPU without the archive, 7-8.5 s with it, on the loaded 2-core
machine). The archive changes how classes are loaded, not what runs: the JVM checks it against its
own version, flags and class path and ignores it silently when they differ. It is built once per
test environment (JDK, venv, jars) by a JVM that exits normally after a small representative
workload (`-XX:ArchiveClassesAtExit`), under a file lock so two xdist workers build it once, and
kept in the temp dir for the next session. Test-only: the platform's Spark settings and the
benchmarks are untouched. `LAKEHOUSE_TEST_JVM_CDS=0` turns it off.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DRIVER_OPTS_ENV = "LAKEHOUSE_SPARK_CONF__spark.driver.extraJavaOptions"
EXECUTOR_OPTS_ENV = "LAKEHOUSE_SPARK_CONF__spark.executor.extraJavaOptions"
#: the archive's own log lines (a class-path mismatch warning) would go to the JVM's stdout
_QUIET = "-Xlog:cds=off,cds+dynamic=off"
STALE_DAYS = 3
#: the test JVMs' own options (tests/conftest.py): C1 only and the serial GC, for short JVMs on tiny data
TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"

BUILD = r"""
import os, sys
from lakehouse.settings import load_settings
from lakehouse.runtime.spark import get_spark
s = load_settings()
spark = get_spark(s, app_name="lakehouse-test-cds")
c = s.catalog_name
land = os.path.join(os.environ["LAKEHOUSE_HOME"], "in.json")
with open(land, "w") as f:
    f.write('{"id": 1, "v": "a"}\n{"id": 2, "v": "b"}\n')
spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {c}.n")
spark.sql(f"CREATE TABLE {c}.n.t (id bigint, v string) USING iceberg "
          "TBLPROPERTIES ('write.wap.enabled'='true')")
spark.read.schema("id bigint, v string").json(land).writeTo(f"{c}.n.t").append()
spark.sql(f"ALTER TABLE {c}.n.t CREATE BRANCH audit_x")
spark.conf.set("spark.wap.branch", "audit_x")
spark.sql(f"MERGE INTO {c}.n.t t USING (SELECT 2 AS id, 'c' AS v UNION ALL SELECT 3, 'd') s ON t.id = s.id "
          "WHEN MATCHED THEN UPDATE SET v = s.v WHEN NOT MATCHED THEN INSERT *")
spark.conf.unset("spark.wap.branch")
spark.sql(f"CALL {c}.system.fast_forward('n.t', 'main', 'audit_x')")
spark.table(f"{c}.n.t").groupBy("v").count().collect()
from pyspark import SparkContext
print(SparkContext._gateway.proc.pid, flush=True)
"""


def _key(options: str) -> str:
    from lakehouse.runtime.spark import SYSTEM_JDBC_JARS, bundled_iceberg_jar

    java = shutil.which("java", path=os.path.join(os.environ["JAVA_HOME"], "bin")) if os.environ.get("JAVA_HOME") \
        else shutil.which("java")
    parts = [sys.prefix, options, os.path.realpath(java) if java else ""]
    for f in (java and os.path.realpath(java), bundled_iceberg_jar(), *SYSTEM_JDBC_JARS):
        if f and os.path.exists(f):
            st = os.stat(f)
            parts.append(f"{f}:{st.st_size}:{int(st.st_mtime)}")
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def isolated_env(drop: tuple[str, ...] = ("LAKEHOUSE_", "DAGSTER_HOME")) -> dict[str, str]:
    """This process's environment without the variables starting with `drop` (a test's platform
    subprocess is isolated from the session's own settings), but with the test JVMs' options
    (tests/conftest.py: C1 only, the serial GC, this archive): dropped with the rest, every `lakehouse
    run` or `dagster dev` a test started ran a default C2/G1 JVM that parsed Spark's classes again."""
    return {k: v for k, v in os.environ.items() if not k.startswith(drop) or k in (DRIVER_OPTS_ENV, EXECUTOR_OPTS_ENV)}


def archive_path(options: str) -> Path:
    return Path(tempfile.gettempdir()) / f"lakehouse-test-jvm-{_key(options)}.jsa"


def use(options: str) -> None:
    """Point this process's (and its subprocesses') Spark drivers at the archive, if it exists."""
    if os.environ.get("LAKEHOUSE_TEST_JVM_CDS", "1") == "0":
        return
    path = archive_path(options)
    current = os.environ.get(DRIVER_OPTS_ENV, "")
    if path.is_file() and "SharedArchiveFile" not in current:
        os.utime(path)  # in use: not stale for another environment's build
        os.environ[DRIVER_OPTS_ENV] = f"{current} -XX:SharedArchiveFile={path} {_QUIET}".strip()


def ensure(options: str, timeout: float = 300.0) -> bool:
    """Build the archive unless it exists or another process is building it, then `use` it; True
    once this process uses it. A process that finds the build under way goes on without it (and
    calls again before its next test) rather than wait; a failed build leaves the tests running
    without it: the archive only makes JVM starts cheaper."""
    if os.environ.get("LAKEHOUSE_TEST_JVM_CDS", "1") == "0":
        return True
    path = archive_path(options)
    if not path.is_file():
        fd = os.open(str(path) + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False  # another worker builds it
            try:
                if not path.is_file():
                    _build(path, options, timeout)
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
    use(options)
    return True


def _build(path: Path, options: str, timeout: float) -> None:
    for old in path.parent.glob("lakehouse-test-jvm-*.jsa"):  # other environments' (~160 MB each), unused for days
        if time.time() - old.stat().st_mtime > STALE_DAYS * 86400:
            old.unlink(missing_ok=True)  # a JVM that maps it keeps its pages; the next session rebuilds
    partial = path.with_suffix(f".{os.getpid()}.partial")
    with tempfile.TemporaryDirectory(prefix="lakehouse-cds-") as home:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LAKEHOUSE_", "DAGSTER_HOME"))}
        env.update({"LAKEHOUSE_HOME": home, "LAKEHOUSE_SHUFFLE_PARTITIONS": "2", "LAKEHOUSE_SPARK_MASTER": "local[2]",
                    DRIVER_OPTS_ENV: f"-Dderby.system.home=/tmp {options} -XX:ArchiveClassesAtExit={partial} {_QUIET}",
                    "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)})
        try:
            out = subprocess.run([sys.executable, "-c", BUILD], env=env, cwd=str(REPO), capture_output=True,
                                 text=True, timeout=timeout)
            pid = int(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 and out.stdout.strip() else None
        except (subprocess.TimeoutExpired, ValueError):
            pid = None
        if pid is None:
            print("tests: no JVM class archive (its build failed); JVMs start without it", file=sys.stderr)
            partial.unlink(missing_ok=True)
            return
        deadline = time.monotonic() + timeout  # the JVM writes the archive as it exits, after Python
        while time.monotonic() < deadline and os.path.exists(f"/proc/{pid}"):
            time.sleep(0.2)
    if partial.is_file() and partial.stat().st_size > 0 and not os.path.exists(f"/proc/{pid}"):
        os.replace(partial, path)
    else:
        partial.unlink(missing_ok=True)


if __name__ == "__main__":
    # scripts/test.sh builds it beside the fast lane (one Python process on one core), so the slow
    # lane's first tests do not share the cores with the build
    ensure(TEST_JVM_OPTIONS)
