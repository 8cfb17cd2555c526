"""Partition strategies and sort order from metadata become the Iceberg table's spec, and the
"one workflow, one month" query prunes files accordingly (PyIceberg scan planning)."""

from __future__ import annotations

from datetime import UTC, datetime

from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.expressions import And, EqualTo, GreaterThanOrEqual, LessThan

from lakehouse.metadata.model import Target


def _rows(spark):
    data = []
    for wf in range(6):
        for month in (10, 11, 12):
            for i in range(4):
                ts = datetime(2025, month, 1 + i, i, tzinfo=UTC)
                data.append((f"wf_{wf}", ts, month, f"m{wf}-{month}-{i}"))
    return spark.createDataFrame(data, "workflow string, ts timestamp, month int, message string")


def test_partition_specs_sort_order_and_pruning(platform, unique_ns):
    tables = platform.tables()
    df = _rows(platform.spark())
    specs = {
        "wf_month": [{"column": "workflow"}, {"column": "month"}],
        "wf_bucket": [{"column": "workflow", "transform": "bucket", "param": 4}],
        "wf_bucket_month": [{"column": "workflow", "transform": "bucket", "param": 4},
                            {"column": "ts", "transform": "month"}],
        "by_day": [{"column": "ts", "transform": "day"}],
        "by_hour": [{"column": "ts", "transform": "hour"}],
    }
    s = platform.settings
    cat = SqlCatalog(s.catalog_name, uri=s.catalog_uri, warehouse=s.warehouse)
    scanned = {}
    for name, spec in specs.items():
        t = Target(target_id=name, namespace=f"p_{unique_ns}", table=name, partition_spec=spec,
                   sort_order=[{"column": "ts", "direction": "desc"}])
        tables.ensure_table(t, df.schema, wap=False)
        tables.write(df, t)
        table = cat.load_table(t.identifier)
        transforms = [str(f.transform) for f in table.spec().fields]
        expected = {"wf_month": ["identity", "identity"], "wf_bucket": ["bucket[4]"],
                    "wf_bucket_month": ["bucket[4]", "month"], "by_day": ["day"], "by_hour": ["hour"]}[name]
        assert transforms == expected, name
        order = table.sort_order()
        assert [(table.schema().find_field(f.source_id).name, f.direction.name) for f in order.fields] == [
            ("ts", "DESC")]
        assert table.scan().to_arrow().num_rows == 72
        one = And(EqualTo("workflow", "wf_3"), EqualTo("month", 11),
                  GreaterThanOrEqual("ts", "2025-11-01T00:00:00+00:00"), LessThan("ts", "2025-12-01T00:00:00+00:00"))
        files = list(table.scan(row_filter=one).plan_files())
        scanned[name] = (len(files), len(list(table.scan().plan_files())))
        assert table.scan(row_filter=one).to_arrow().num_rows == 4
    # identity(workflow)+identity(month) reads exactly one file for one workflow and one month;
    # bucket(4) alone must read a whole bucket's months too
    assert scanned["wf_month"][0] == 1
    assert scanned["wf_bucket"][0] >= 1 and scanned["wf_bucket"][0] <= scanned["wf_bucket"][1]
    assert scanned["wf_bucket_month"][0] == 1
    assert scanned["by_day"][0] == 4 and scanned["by_hour"][0] == 4  # the 4 days / hours of November
