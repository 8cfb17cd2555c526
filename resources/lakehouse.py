"""The platform resource: settings and control DB, read from the environment at use time, and S3
through dagster-aws's `S3Resource`."""

from __future__ import annotations

import dagster as dg
from dagster_aws.s3 import S3Resource

from lakehouse.platform import Platform
from lakehouse.s3access import S3Clients, s3_resource


class LakehouseResource(dg.ConfigurableResource):
    """Hands a `Platform` to assets, sensors and schedules.

    Nothing is cached on the resource: each step re-reads the control DB, which is what lets a
    metadata update (a flag, a throttle, a rule) apply without a code-location reload. Every S3
    client the step's domain code uses comes from `s3` (endpoint and region are configuration;
    credentials stay in the environment, read by boto3 when a client is made, never shown).
    """

    s3: S3Resource | None = None  # None: the same resource class configured from settings (as the CLI)

    @classmethod
    def from_settings(cls) -> LakehouseResource:
        """The resource as the code location configures it: S3 endpoint from settings."""
        return cls(s3=s3_resource(None))

    def platform(self) -> Platform:
        return Platform.from_env(S3Clients.from_resource(self.s3) if self.s3 is not None else None)
