"""A table or query of a JDBC database (full, incremental by watermark, partitioned reads)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from lakehouse.compat import pyspark as pyspark_compat
from lakehouse.errors import SourceUnavailable
from lakehouse.ingest import jdbc as jdbc_ingest
from lakehouse.settings import named_secret
from lakehouse.sources.base import SourceAdapter, register
from lakehouse.stage.core import Batch, ExtractPlan, StageContext, StageOutcome

if TYPE_CHECKING:
    from lakehouse.metadata.model import Source
    from lakehouse.platform import Platform
    from lakehouse.table.publish import PublishResult

PROBE_TIMEOUT_S = 5


def jdbc_url_of(src: Any) -> str:
    """The URL of a JDBC source or warehouse target (`jdbc_url_env` first)."""
    url = named_secret(src.jdbc_url_env)
    url = url or src.jdbc_url
    if not url:
        raise SourceUnavailable(f"{src.jdbc_url_env or 'jdbc_url'} is not set")
    return url


def probe_jdbc(platform: Platform, src: Any) -> tuple[bool, str]:
    """Open (and close) one real connection: PostgreSQL through psycopg2, any other driver
    through the JVM's DriverManager. Raises on failure (callers report it)."""
    url = jdbc_url_of(src)
    user = named_secret(src.user_env)
    password = named_secret(src.password_env)
    if url.startswith("jdbc:postgresql:"):
        import psycopg2

        parts = urlsplit(url[len("jdbc:"):])
        params = {k: v[0] for k, v in parse_qs(parts.query).items()}
        conn = psycopg2.connect(host=parts.hostname or "localhost", port=parts.port or 5432,
                                dbname=(parts.path or "/").lstrip("/") or None,
                                user=user or params.get("user"), password=password,
                                connect_timeout=PROBE_TIMEOUT_S)
        conn.close()
        return True, f"connected to {parts.hostname}:{parts.port or 5432}"
    jvm = pyspark_compat.jvm(platform.spark())  # any other driver: a real JDBC connection through the JVM
    props = jvm.java.util.Properties()
    if user:
        props.setProperty("user", user)
    if password:
        props.setProperty("password", password)
    jvm.java.sql.DriverManager.setLoginTimeout(PROBE_TIMEOUT_S)
    jvm.java.sql.DriverManager.getConnection(url, props).close()
    return True, "connected"


def jdbc_platform(url: str | None) -> str:
    """DataHub's platform name for a JDBC URL."""
    if not url:
        return "postgres"
    scheme = url.split(":", 2)[1] if url.startswith("jdbc:") else url.split(":", 1)[0]
    return {"postgresql": "postgres", "redshift": "redshift", "mysql": "mysql", "sqlserver": "mssql",
            "oracle": "oracle", "snowflake": "snowflake", "sqlite": "sqlite"}.get(scheme, scheme)


@register
class JdbcAdapter(SourceAdapter):
    kind = "jdbc"
    plans_against_main = True
    subtype = "Table"

    def plan(self, ctx: StageContext, src: Source, plan: ExtractPlan) -> None:
        jdbc_ingest.plan(ctx, src, plan)

    def batches(self, ctx: StageContext, plan: ExtractPlan) -> Iterator[Batch]:
        yield from jdbc_ingest.batches(ctx, plan)

    def after_publish(self, ctx: StageContext, plan: ExtractPlan, outcome: StageOutcome) -> None:
        jdbc_ingest.after_publish(ctx, plan, outcome)  # rows read / watermark into metadata; drop the staged copy

    def remainder(self, plan: ExtractPlan, result: PublishResult) -> ExtractPlan | None:
        return jdbc_ingest.remainder(plan, result.overlap)

    def probe(self, platform: Platform, src: Source) -> tuple[bool, str]:
        try:
            return probe_jdbc(platform, src)
        except Exception as exc:  # noqa: BLE001 - a probe reports, it never raises
            return False, f"{type(exc).__name__}: {exc}"

    def dataset_name(self, src: Source) -> tuple[str, str]:
        url = src.jdbc_url if not src.jdbc_url_env else (named_secret(src.jdbc_url_env) or src.jdbc_url)
        return jdbc_platform(url), (src.table or src.source_id).lower()
