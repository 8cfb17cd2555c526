"""Sensors generated from metadata: file arrivals (local landing zone or S3 prefix) per source."""

from __future__ import annotations

import dagster as dg

from lakehouse.metadata.model import MetadataCatalog
from sensors.arrivals import build_arrival_sensors
from sensors.killswitch import build_killswitch_sensor
from sensors.throughput import build_throughput_sensor


def build_sensors(catalog: MetadataCatalog) -> list[dg.SensorDefinition]:
    return [*build_arrival_sensors(catalog), build_throughput_sensor(), build_killswitch_sensor()]
