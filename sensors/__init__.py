"""Sensors generated from metadata: file arrivals (one sensor over every landing zone and S3 prefix),
plus the platform's own control loops (throughput sync, kill switch, alerts)."""

from __future__ import annotations

import dagster as dg

from lakehouse_assets.factory import Graph
from sensors.alerts import build_alert_sensors
from sensors.arrivals import build_arrival_sensor
from sensors.killswitch import build_killswitch_sensor
from sensors.throughput import build_throughput_sensor


def build_sensors(g: Graph, pipelines: set[str] | None = None, *, platform_loops: bool = True
                  ) -> list[dg.SensorDefinition]:
    """`pipelines`: the arrivals of these pipelines only (a code location's); `platform_loops`: with the
    platform's control loops (the default code location has them, the others do not)."""
    arrivals = build_arrival_sensor(g, pipelines)
    loops = [build_throughput_sensor(), build_killswitch_sensor(), *build_alert_sensors()] if platform_loops else []
    return [*([arrivals] if arrivals is not None else []), *loops]
