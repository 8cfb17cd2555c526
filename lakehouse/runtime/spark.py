"""SparkSession configuration for Iceberg: one JVM per process, shared by every asset of a run."""

from __future__ import annotations

import importlib.resources
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from lakehouse.compat import pyspark as pyspark_compat
from lakehouse.runtime.fileperms import apply_umask, hadoop_umask
from lakehouse.settings import Settings
from lakehouse.sql.text import quote
from lakehouse.table.sqlite_files import prepare_sqlite

_LOCK = threading.Lock()
_SESSION = None  # the process-wide session
_THREAD = threading.local()  # per thread: what waits for the session (`when_started`)
_WHILE_STARTING: list[Callable[[], None]] = []  # work for a thread that would wait (`while_starting`)

# Debian's libxerial-sqlite-jdbc-java / libpostgresql-jdbc-java put their drivers here.
SYSTEM_JDBC_JARS = ("/usr/share/java/sqlite-jdbc.jar", "/usr/share/java/postgresql.jar")


def bundled_iceberg_jar() -> str | None:
    """The Iceberg Spark runtime shipped in the `snowpark-connect-deps-iceberg` wheel, if installed."""
    try:
        jars = importlib.resources.files("snowpark_connect_deps_iceberg") / "jars"
    except ModuleNotFoundError:
        return None
    for entry in jars.iterdir():
        if entry.name.startswith("iceberg-spark-runtime-3.5_2.12") and entry.name.endswith(".jar"):
            return str(entry)
    return None


def catalog_conf(settings: Settings) -> dict[str, str]:
    """The Iceberg JDBC catalog (shared with PyIceberg's SqlCatalog under the same name)."""
    cat = f"spark.sql.catalog.{settings.catalog_name}"
    conf = {
        cat: "org.apache.iceberg.spark.SparkCatalog",
        f"{cat}.type": "jdbc",
        f"{cat}.uri": settings.catalog_jdbc_url,
        f"{cat}.warehouse": settings.warehouse,
        f"{cat}.jdbc.schema-version": "V1",
        # Other processes (concurrent runs, PyIceberg) commit too: never serve a stale cached table.
        f"{cat}.cache-enabled": "false",
    }
    if settings.catalog_jdbc_url.startswith("jdbc:postgresql:"):
        # after a server restart a pooled connection fails with "terminating connection due to
        # administrator command" (57P01) or the like: let Iceberg reconnect instead of failing
        conf[f"{cat}.retryable_status_codes"] = "57P01,57P02,57P03,08001,08004"
    if settings.catalog_jdbc_url.startswith("jdbc:sqlite:"):
        # Concurrent runs commit to the embedded catalog: wait for SQLite's lock instead of failing after 3 s.
        conf[f"{cat}.jdbc.busy_timeout"] = "30000"
    user, password = settings.catalog_credentials()
    if user:
        conf[f"{cat}.jdbc.user"] = user
    if password:
        conf[f"{cat}.jdbc.password"] = password
    return conf


#: a pure-Java Hadoop codec for `.zst` (aircompressor, on Spark's own classpath since Spark 3.x)
ZSTD_CODEC = "io.airlift.compress.zstd.ZstdCodec"


def spark_conf(settings: Settings, app_name: str = "lakehouse") -> dict[str, str]:
    """Session settings: Iceberg extensions, jars, the catalog, and sane defaults for small machines."""
    jars: list[str] = []
    if settings.spark_jars:
        jars.extend(j for j in settings.spark_jars.split(",") if j)
    elif not settings.spark_packages:
        jar = bundled_iceberg_jar()
        if jar is None:
            raise RuntimeError(
                "no Iceberg Spark runtime: install snowpark-connect-deps-iceberg==1.0.2 or set "
                "LAKEHOUSE_SPARK_PACKAGES=org.apache.iceberg:iceberg-spark-runtime-3.5_2.12:<version>"
            )
        jars.append(jar)
    jars.extend(j for j in SYSTEM_JDBC_JARS if Path(j).exists() and j not in jars)
    conf = {
        "spark.master": settings.spark_master,
        "spark.app.name": app_name,
        "spark.sql.extensions": "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions",
        **catalog_conf(settings),
        "spark.sql.defaultCatalog": settings.catalog_name,
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": str(settings.shuffle_partitions),
        "spark.ui.enabled": "true" if settings.spark_ui else "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.memory": settings.spark_driver_memory,
        "spark.sql.sources.partitionOverwriteMode": "dynamic",
        "spark.driver.extraJavaOptions": "-Dderby.system.home=/tmp",
        # Hadoop chmods each file it writes (warehouse data and metadata) itself: owner-only by default
        "spark.hadoop.fs.permissions.umask-mode": hadoop_umask(settings.umask),
        # `.zst` inputs (JSON lines, CSV): Hadoop's own ZStandardCodec needs libhadoop's native zstd,
        # absent from pip-installed Spark; aircompressor's pure-Java codec (a jar Spark ships) reads
        # them. Codecs named here take precedence over the discovered ones for their extension.
        "spark.hadoop.io.compression.codecs": ZSTD_CODEC,
    }
    if jars:
        conf["spark.jars"] = ",".join(jars)
        # JDBC drivers must be visible to java.sql.DriverManager, i.e. on the driver's system classpath.
        conf["spark.driver.extraClassPath"] = ":".join(jars)
        conf["spark.executor.extraClassPath"] = ":".join(jars)
    if settings.spark_packages:
        conf["spark.jars.packages"] = settings.spark_packages
    conf.update(settings.spark_conf)
    return conf


_SECRET_KEY = ("password", "secret", "token", "credential", "jdbc.user")


def is_secret_key(key: str) -> bool:
    """A Spark setting whose value is a credential: never shown (Dagster UI, logs)."""
    return any(part in key.lower() for part in _SECRET_KEY)


def shown_conf(settings: Settings, app_name: str = "lakehouse") -> dict[str, str]:
    """`spark_conf` without its credentials: what the Dagster PySpark resource shows."""
    return {k: v for k, v in spark_conf(settings, app_name).items() if not is_secret_key(k)}


_CONFIGURED: dict[str, dict[str, str]] = {}  # "conf": the conf the Dagster PySpark resource gave this process


def configure_session(conf: dict[str, str] | None) -> None:
    """The conf this process's session is built from, as the Dagster PySpark resource holds it (no
    credentials: `shown_conf`, or what a run's config changed in it); None: `spark_conf(settings)`.
    The credentials always come from the settings the session is built with (`session_conf`)."""
    if conf is None:
        _CONFIGURED.pop("conf", None)
    else:
        _CONFIGURED["conf"] = {str(k): str(v) for k, v in conf.items()}


def session_conf(settings: Settings, app_name: str = "lakehouse") -> dict[str, str]:
    """What `get_spark` builds the session from: the conf the PySpark resource shows (when a Dagster
    run configured one, `configure_session`) plus the credentials of `settings`; else `spark_conf`."""
    full = spark_conf(settings, app_name)
    shown = _CONFIGURED.get("conf")
    if shown is None:
        return full
    return {**shown, **{k: v for k, v in full.items() if is_secret_key(k)}}


def get_spark(settings: Settings, app_name: str = "lakehouse"):
    """The process-wide SparkSession; built once, reused by every step of every run in this process."""
    from pyspark.sql import SparkSession

    global _SESSION
    if _SESSION is None and _WHILE_STARTING and _LOCK.locked():
        _work_while_starting()  # another thread is starting the session: this one would only wait
    with _LOCK:
        spark = _SESSION
        if not pyspark_compat.is_stopped(spark):
            _ensure_catalog(spark, settings)
        else:
            builder = SparkSession.builder
            for k, v in session_conf(settings, app_name).items():
                builder = builder.config(k, v)
            _prepare_local_dirs(settings)
            spark = builder.getOrCreate()
            spark.sparkContext.setLogLevel(settings.spark_log_level)
            _SESSION = spark
            _renew_sqlite_catalog_pool(spark, settings)
    waiting = getattr(_THREAD, "waiting", None)
    if waiting:
        callbacks = list(waiting)
        waiting.clear()
        for callback in callbacks:
            callback(spark)
    return spark


def while_starting(work: Callable[[], None]) -> Callable[[], None]:
    """`work` (a no-argument function, e.g. an import the run needs anyway) runs once on the first
    thread that asks for the session while another thread is starting it (`lakehouse run` starts
    the JVM on a thread of its own): work that needs no JVM is then done in the seconds that
    thread would spend waiting for it, not after. Work that finds no such wait (the session came
    up first, or while earlier work ran) is not done here: it happens where it is needed, as
    without it. Returns a function that withdraws it."""
    if _SESSION is None and work not in _WHILE_STARTING:  # a session that is up has no wait to fill
        _WHILE_STARTING.append(work)

    def withdraw() -> None:
        if work in _WHILE_STARTING:
            _WHILE_STARTING.remove(work)

    return withdraw


def _work_while_starting() -> None:
    import logging

    while _SESSION is None and _LOCK.locked():  # only while the session is still being started
        try:
            work = _WHILE_STARTING.pop(0)
        except IndexError:
            return
        try:
            work()
        except Exception:  # noqa: BLE001 - a head start only: whoever needs it does it (and raises) again
            logging.getLogger(__name__).debug("work while the JVM starts failed", exc_info=True)


def active_session():
    """The process's SparkSession if it is up, else None: never starts one, never waits for one
    being started (`lakehouse run` warms one up on another thread)."""
    spark = _SESSION
    return None if pyspark_compat.is_stopped(spark) else spark


@contextmanager
def when_started(callback: Callable) -> Iterator[None]:
    """Inside the block, `callback(session)` runs on this thread when this thread first gets the
    session from `get_spark` — so per-thread Spark settings (a job group) can wait for the JVM
    instead of starting it: a step with no Spark work never starts or waits for one."""
    waiting = _THREAD.__dict__.setdefault("waiting", [])
    waiting.append(callback)
    try:
        yield
    finally:
        if callback in waiting:
            waiting.remove(callback)


def _ensure_catalog(spark, settings: Settings) -> None:
    """Register this settings' catalog on an existing session (catalogs are runtime-configurable),
    and make the session the calling thread's active one: that thread's Java calls resolve the
    catalog through it (lakehouse.compat.pyspark.make_active; a session built here is made active
    on the thread building it by PySpark itself)."""
    pyspark_compat.make_active(spark)
    _prepare_local_dirs(settings)
    for k, v in catalog_conf(settings).items():
        if spark.conf.get(k, None) != v:
            spark.conf.set(k, v)
    _renew_sqlite_catalog_pool(spark, settings)


_RENEWED: set[tuple[str, str]] = set()


def _renew_sqlite_catalog_pool(spark, settings: Settings) -> None:
    """Give Iceberg's JDBC catalog on SQLite fresh connections once it has initialized.

    Initializing a JdbcCatalog on existing catalog tables leaves a read transaction open on one
    pooled sqlite-jdbc connection (the schema probe's metadata query is never reset). In WAL mode
    that connection then fails every later write with SQLITE_BUSY_SNAPSHOT as soon as any other
    connection or process has written the catalog: concurrent runs, or PyIceberg's publish
    commits. Replacing the pool right after initialization (same URL, same properties) leaves no
    such connection behind. PostgreSQL catalogs are not affected and are left alone.
    """
    key = (settings.catalog_name, settings.catalog_jdbc_url)
    if not settings.catalog_jdbc_url.startswith("jdbc:sqlite:") or key in _RENEWED:
        return
    spark.sql(f"SHOW NAMESPACES IN {quote(settings.catalog_name)}").collect()  # initializes the catalog
    try:
        jcat = pyspark_compat.java_session(spark).sessionState().catalogManager().catalog(settings.catalog_name).icebergCatalog()
        cls = jcat.getClass()
        pool_field = cls.getDeclaredField("connections")
        props_field = cls.getDeclaredField("catalogProperties")
        pool_field.setAccessible(True)
        props_field.setAccessible(True)
        old = pool_field.get(jcat)
        fresh = pyspark_compat.jvm(spark).org.apache.iceberg.jdbc.JdbcClientPool(settings.catalog_jdbc_url,
                                                                            props_field.get(jcat))
        pool_field.set(jcat, fresh)
        old.close()
    except Exception:  # noqa: BLE001 - another Iceberg version: writes then retry on busy errors instead
        import logging

        logging.getLogger(__name__).warning("could not renew the SQLite catalog's connection pool", exc_info=True)
    _RENEWED.add(key)


def _prepare_local_dirs(settings: Settings) -> None:
    apply_umask(settings.umask)  # before the JVM starts: it inherits the process umask
    if settings.warehouse_path is not None:
        settings.warehouse_path.mkdir(parents=True, exist_ok=True)
    prepare_sqlite(settings.catalog_uri)


def release_jvm_at_exit() -> None:
    """Kill a JVM this process is still starting (`lakehouse run` warms one up in the background;
    a run with nothing to load never waits for it). Left alone, it would go on starting after we
    exit — seconds of CPU taken from the runs that do work — and only then notice the closed pipe.
    A JVM with a session is left to exit by itself, as before."""
    import signal

    if _SESSION is not None:
        return
    for pid in _own_spark_children():
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _own_spark_children() -> list[int]:
    """Pids of this process's child JVMs running SparkSubmit (Linux /proc; [] elsewhere)."""
    from lakehouse.runtime import procstat

    me = os.getpid()
    return [st.pid for st in procstat.snapshot().values()
            if st.ppid == me and any("SparkSubmit" in arg for arg in procstat.cmdline(st.pid) or ())]


def stop_spark() -> None:
    """Used by the restart_spark_session healing action."""
    global _SESSION
    with _LOCK:
        if _SESSION is not None:
            _SESSION.stop()
        _SESSION = None


_EARLY: dict[str, threading.Thread] = {}  # the JVM `start_early` launched, if any


def start_early(argv: list[str], settings_of: Callable[[], Settings]) -> threading.Thread | None:
    """`lakehouse run <pipeline>`'s JVM, launched before the command line's own imports (the
    metadata model, SQLAlchemy, the control DB: ~0.7 s, then Dagster) when the run surely needs
    Spark: the pipeline has a Python stage or a SQL stage on Spark SQL (the Arrow engine writes
    neither, so the run's own decision, `lakehouse.engines.choice.may_need_spark`, says the same; a DuckDB
    SQL stage may run without a JVM, and is left to that decision). Decided from the embedded
    control DB with the standard library's sqlite3 and nothing else (a disabled pipeline starts
    none: its run is stopped before it starts); any doubt (another database,
    no such file or table, another command, LAKEHOUSE_SPARK_WARMUP=0) starts nothing here and
    leaves the decision to the run, as before. A wrong guess costs a JVM: `release_jvm_at_exit`
    (at the run's end, or at exit if the run never starts) kills one still starting. `settings_of`
    is the entry point's `load_settings` (only entry points read the environment). Returns the
    thread starting it."""
    if len(argv) < 2 or argv[0] != "run" or argv[1].startswith("-") or "-h" in argv or "--help" in argv:
        return None
    from lakehouse.table.sqlite_files import sqlite_path

    try:
        settings = settings_of()
        if not settings.spark_warmup:
            return None
        db = sqlite_path(settings.control_db_url)
        if db is None or not db.is_file():
            return None
        import sqlite3

        con = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True, timeout=1)
        try:
            # and only while the pipeline may run: a kill switch stops the run before it starts (no JVM)
            found = con.execute(
                "SELECT 1 FROM stages WHERE pipeline_id = ? AND (python_transformation IS NOT NULL OR "
                "((transformation IS NOT NULL OR transformation_file IS NOT NULL) AND coalesce(sql_engine, 'spark') <> 'duckdb')) "
                "AND NOT EXISTS (SELECT 1 FROM control_flags WHERE entity_type = 'platform' AND entity_id = '*' "
                "AND flag_name = 'enabled' AND NOT flag_value) "
                "AND coalesce((SELECT flag_value FROM control_flags WHERE entity_type = 'pipeline' AND entity_id = ? "
                "AND flag_name = 'enabled'), (SELECT enabled FROM pipelines WHERE pipeline_id = ?)) LIMIT 1",
                (argv[1], argv[1], argv[1])).fetchone()
        finally:
            con.close()
    except Exception:  # noqa: BLE001 - a guess only: the run decides again after its imports
        return None
    if not found:
        return None
    import atexit

    atexit.register(release_jvm_at_exit)  # a command line the parser refuses ends before the run does
    return warm_up(settings)


def starting() -> bool:
    """Whether a `warm_up` is still starting this process's session (no session yet)."""
    running = _EARLY.get("thread")
    return _SESSION is None and running is not None and running.is_alive()


def started_or_starting() -> bool:
    """Whether this process has its session, or a `warm_up` is starting it."""
    return _SESSION is not None or starting()


def warm_up(settings: Settings) -> threading.Thread:
    """Start the process's SparkSession and its catalog on a thread of its own; the first
    `get_spark` waits for it, a failure is left for that call to raise. PySpark is imported on
    the calling thread first: the caller goes on importing while the session starts, and two
    threads importing one package at once can see it partially initialised."""
    import logging

    import pyspark.sql  # noqa: F401

    running = _EARLY.get("thread")
    if running is not None and running.is_alive():
        return running

    def start() -> None:
        try:
            spark = get_spark(settings)
            # the first statement initializes Spark SQL and the Iceberg catalog: seconds more
            spark.sql(f"SHOW NAMESPACES IN {quote(settings.catalog_name)}").collect()
        except Exception:  # noqa: BLE001 - reported by the caller's own get_spark call
            logging.getLogger(__name__).debug("background Spark start failed", exc_info=True)

    thread = threading.Thread(target=start, name="spark-warmup", daemon=True)
    _EARLY["thread"] = thread
    thread.start()
    return thread
