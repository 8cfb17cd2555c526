"""The platform resource: settings and control DB, read from the environment at use time."""

from __future__ import annotations

import dagster as dg

from lakehouse.runner import Platform


class LakehouseResource(dg.ConfigurableResource):
    """Hands a `Platform` to assets, sensors and schedules.

    Nothing is cached on the resource: each step re-reads the control DB, which is what lets a
    metadata update (a flag, a throttle, a rule) apply without a code-location reload.
    """

    def platform(self) -> Platform:
        return Platform.from_env()
