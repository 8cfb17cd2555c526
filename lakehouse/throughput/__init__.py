"""Throughput control: Dagster pools from throttles, a shared token bucket, scheduling profiles."""
