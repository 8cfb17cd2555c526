"""The JSON-lines probe's pyarrow path (`_probe_jsonl_arrow`) answers only what the Python probe
would answer: the same schema, row count and verdict, or nothing (fast lane: no Spark)."""

from __future__ import annotations

import itertools
import json
import random

import pytest
from pyspark.sql.types import BooleanType, DoubleType, IntegerType, LongType, StringType, TimestampType

from lakehouse.ingest.files import PROCESSED
from lakehouse.ingest.limits import LimitExceeded
from lakehouse.ingest.probe import _probe_jsonl, _probe_jsonl_arrow, probe_file
from lakehouse.metadata.model import FileLimits

EXPECTS = [{}, {"a": LongType()}, {"a": IntegerType()}, {"a": DoubleType(), "b": StringType()},
           {"c": TimestampType()}, {"d": BooleanType()}]
#: each field keeps one JSON type family, so that most files are ones the pyarrow path answers
FAMILIES = {"a": [1, -7, None, 2**40], "b": [2.5, 1, None, float("nan")], "c": ["x", "2026-01-01 00:00:00", None, "12"],
            "d": [True, False, None], "e": [{"x": 1}, {"y": "s"}, {}, None, {"x": 2, "z": [1, 2]}],
            "f": [[1], [], None, [2.5]], "g": [[{"z": 1}], [{"w": "q"}], []], "h": [None]}
#: what pyarrow and Python's json read differently (each must be left to the Python probe)
EDGES = [b'{"a":1}\n{"a":99999999999999999999}\n', b'{"a":1}\nnull\n', b'{"a":1} {"a":2}\n', b'{"a":1,"a":2}\n',
         b'{"a":1,"A":2}\n', b'{"a":"\xff\xfe"}\n', b'{"a":"\\ud800"}\n', b'{"a":1}\n{"a":"x"}\n', b'{"a":true}\n{"a":1}\n',
         b'{"a":{"x":1}}\n{"a":1}\n', b'{"a":1}\n[1,2]\n', b"", b"\n\n", b'\xef\xbb\xbf{"a":1}\n', b'{"a":1e400}\n',
         b'{"a":[{"x":1},{"X":2}]}\n', b'{"":1}\n', b'{"a":{}}\n', b'{"a":[]}\n{"a":[null]}\n', b'{"a":-0}\n{"a":1e5}\n',
         b'{"t":"2026-01-01"}\n{"t":"2026-01-02 10:00:00"}\n', b'{"a":1}\r\n\r\n{"a":2}\r\n']


def outcome(probe) -> tuple:
    return probe.status, probe.error, probe.schema.simpleString() if probe.schema else None, probe.rows, probe.read_key


def python_probe(path, limits, expect) -> tuple:
    try:
        with open(path, "rb") as fh:
            return outcome(_probe_jsonl(fh, limits, expect))
    except LimitExceeded as exc:
        return ("limit", str(exc))


def corpus(seed: int = 7) -> list[bytes]:
    rng = random.Random(seed)
    files = list(EDGES)
    for _ in range(150):
        rows = [json.dumps({k: rng.choice(v) for k, v in FAMILIES.items() if rng.random() < 0.8})
                for _ in range(rng.randint(1, 30))]
        files.append(("\n".join(rows) + ("\n" if rng.random() < 0.5 else "")).encode())
    return files


def test_the_pyarrow_path_agrees_with_the_python_probe_whenever_it_answers(tmp_path):
    answered = 0
    limits = [FileLimits(), FileLimits(max_depth=2, max_columns=5, max_line_bytes=200, max_field_chars=20)]
    for n, (data, expect, lim) in enumerate(itertools.product(corpus(), EXPECTS, limits)):
        path = tmp_path / f"f{n}.jsonl"
        path.write_bytes(data)
        fast = _probe_jsonl_arrow(path, lim, expect)
        if fast is None:
            continue
        answered += 1
        assert outcome(fast) == python_probe(path, lim, expect), (data[:200], expect, lim)
    assert answered > 500  # it does answer the ordinary files (most of the corpus)


@pytest.mark.parametrize("data", EDGES)
def test_what_pyarrow_reads_otherwise_is_left_to_the_python_probe(tmp_path, data):
    path = tmp_path / "x.jsonl"
    path.write_bytes(data)
    fast = _probe_jsonl_arrow(path, FileLimits(), {})
    assert fast is None or outcome(fast) == python_probe(path, FileLimits(), {})


def test_a_file_the_python_probe_refuses_keeps_its_reason(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_bytes(b'{"id":1}\n{"id":"two"}\nnull\n')
    p = probe_file(path, "jsonl", limits=FileLimits(), expect={"id": LongType()})
    assert p.status != PROCESSED and p.error.startswith("line 2: column id")


def test_a_landing_file_is_answered_by_pyarrow(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_text("".join(json.dumps({"event_id": f"e{n}", "user_id": n, "amount": n * 0.5, "ts": "2026-01-01 00:00:00",
                                        "ctx": {"device": "web"}, "tags": ["a"]}) + "\n" for n in range(500)))
    fast = _probe_jsonl_arrow(path, FileLimits(), {"user_id": LongType(), "ts": TimestampType()})
    assert fast is not None and fast.rows == 500
    assert outcome(fast) == python_probe(path, FileLimits(), {"user_id": LongType(), "ts": TimestampType()})
    assert fast.schema.simpleString() == ("struct<event_id:string,user_id:bigint,amount:double,ts:timestamp,"
                                          "ctx:struct<device:string>,tags:array<string>>")
