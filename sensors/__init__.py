"""Sensors generated from metadata: file arrivals (one sensor over every landing zone and S3 prefix),
plus the platform's own control loops (throughput sync, kill switch, alerts)."""

from __future__ import annotations

import dagster as dg

from lakehouse_assets.factory import Graph
from sensors.alerts import build_alert_sensors
from sensors.arrivals import build_arrival_sensor
from sensors.killswitch import build_killswitch_sensor
from sensors.throughput import build_throughput_sensor


def build_sensors(g: Graph) -> list[dg.SensorDefinition]:
    arrivals = build_arrival_sensor(g)
    return [*([arrivals] if arrivals is not None else []), build_throughput_sensor(), build_killswitch_sensor(),
            *build_alert_sensors()]
