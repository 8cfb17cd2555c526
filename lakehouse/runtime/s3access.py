"""S3 clients for the domain, made by an injected provider: dagster-aws's `S3Resource`.

The domain never builds a boto3 client itself. A `Platform` carries an `S3Clients`; the Dagster
layer builds it from the `S3Resource` nested in `LakehouseResource` (resources/lakehouse.py),
the CLI and sensors from the same resource class configured from settings (`s3_resource`).
Credentials are never configuration here: boto3's standard chain reads them from the
environment / profile when a client is made, so they never appear in Dagster's config, in
materialization metadata or in logs.

What `S3Resource` supports (dagster-aws 0.29, checked in the installed package): endpoint_url,
region_name, profile_name, max_attempts (botocore `standard` retries), use_ssl, verify,
use_unsigned_session and explicit keys. It has no connection-pool size and no timeouts: each
client gets botocore's default pool of 10 connections. boto3 clients are thread-safe to *use*
(not to create concurrently), so threads share clients; a download with more than 10 threads
gets one client per 10 threads (`for_threads`), each with its own pool, instead of one client
whose pool would drop and reopen connections past 10.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dagster_aws.s3 import S3Resource

    from lakehouse.metadata.model import Source
    from lakehouse.settings import Settings

#: (endpoint_url or None, max_attempts) -> a botocore S3 client
S3ClientFactory = Callable[[str | None, int], Any]

#: botocore's default max_pool_connections, which S3Resource does not let us change
POOL_CONNECTIONS = 10
DEFAULT_MAX_ATTEMPTS = 5


class S3Clients:
    """Clients made by one factory, cached per (endpoint, attempts, lane) and shared by threads."""

    def __init__(self, factory: S3ClientFactory, default_endpoint: str | None = None):
        self._factory = factory
        self.default_endpoint = default_endpoint
        self._clients: dict[tuple[str | None, int, int], Any] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_resource(cls, resource: S3Resource) -> S3Clients:
        """Every client is the resource's own `get_client()`; a source's endpoint (metadata) or a
        probe's single attempt is a copy of the resource with that one field changed."""

        def make(endpoint: str | None, attempts: int) -> Any:
            changes = {k: v for k, v in (("endpoint_url", endpoint), ("max_attempts", attempts))
                       if getattr(resource, k) != v}
            return (resource.model_copy(update=changes) if changes else resource).get_client()

        return cls(make, resource.endpoint_url)

    def endpoint_for(self, source: Source | None) -> str | None:
        """The platform's endpoint (LAKEHOUSE_S3_ENDPOINT_URL: tests, MinIO, moto) overrides the
        source's `endpoint_url` from metadata."""
        return self.default_endpoint or (source.endpoint_url if source is not None else None)

    def client(self, endpoint_url: str | None = None, *, max_attempts: int = DEFAULT_MAX_ATTEMPTS,
               lane: int = 0) -> Any:
        key = (endpoint_url, max_attempts, lane)
        with self._lock:  # creating clients concurrently is not thread-safe in boto3
            if key not in self._clients:
                self._clients[key] = self._factory(endpoint_url, max_attempts)
            return self._clients[key]

    def for_source(self, source: Source | None, **kw: Any) -> Any:
        return self.client(self.endpoint_for(source), **kw)

    def for_threads(self, endpoint_url: str | None, threads: int) -> list[Any]:
        """Enough clients for `threads` workers at 10 pooled connections each (thread i uses
        client i % len)."""
        return [self.client(endpoint_url, lane=i) for i in range(max(1, math.ceil(threads / POOL_CONNECTIONS)))]


def s3_resource(settings: Settings | None = None) -> S3Resource:
    """The S3Resource the platform uses outside a Dagster step (CLI, sensors): endpoint from
    settings, region from AWS_DEFAULT_REGION, credentials and profile from the environment."""
    from dagster_aws.s3 import S3Resource

    from lakehouse.settings import CatalogSettings, current

    # the settings' endpoint (a LakehouseResource field wins there), else the environment's now
    now = current(CatalogSettings)
    endpoint = (settings.s3_endpoint_url if settings is not None else None) or now.s3_endpoint_url
    return S3Resource(endpoint_url=endpoint or None,
                      region_name=(settings or now).aws_default_region,
                      max_attempts=DEFAULT_MAX_ATTEMPTS)
